"""The Train pane's calibration view: the Pareto front of behaviour moved against KL, as a table and a plot.

Shown when a ``calibrate`` job finishes and when an artifact with a ``calibration`` record is
loaded (its front is computed from the record's trials with the engine's own ``pareto``, which
imports no torch). The table holds, per sign, every front point (the screening sets' ladder)
and the chosen strength measured on the whole sets, marked ``✓ chosen``; ``enter`` on a row asks
the pane to adopt it (:class:`CalibrationView.Adopt`). Beside it on a wide screen the plot:
x is the mean KL from the unsteered model (nats, log scale), y the behaviour moved toward the
sign, one series per sign, the KL budget a vertical line and the chosen points marked. Like the
other plots, plotext is imported when the first front arrives, never for the first paint.

An artifact calibrated with ``--mode ablate`` shows its ablation's front instead (:meth:`CalibrationView.
show_ablation`): per candidate the layer whose direction is ablated, its weight profile, the share of trait
prompts still refused and the first-token KL, the chosen one measured on every prompt; the plot is refused
against KL. ``enter`` on the chosen row ablates with the artifact as calibrated
(:class:`CalibrationView.AdoptAblation`); another row's flags are said, for ``generate`` to take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from ster.tui.settings import layer_words

SIGNS = ((1, "+", "cyan"), (-1, "−", "magenta"))
"""Per sign: its sign, how the view writes it, and its series' colour."""


@dataclass(frozen=True)
class FrontRow:
    """One row of the view: a measured point of one candidate at one strength."""

    sign: int
    layers: tuple[int, ...]
    method: str
    strength: float
    """A signed multiple of each layer's activation spread (the calibrated artifact's relative unit)."""
    kl: float
    moved: float
    """Behaviour moved toward the row's sign (positive: its own way)."""
    chosen: bool = False
    """The strength calibrate chose for this sign, measured on the whole neutral set and every held-out pair."""

    def strength_text(self) -> str:
        """The strength as a field takes it: ``0.3x``, ``-0.4832x``."""
        return f"{round(self.strength, 4):g}x"

    def shown_strength(self) -> str:
        return f"{self.strength:+.3g}x"

    def candidate(self) -> str:
        return f"{self.method} at {layer_words(list(self.layers))}"


def front_rows(
    calibration: dict[str, Any], front: list[dict[str, Any]], method: str, layers: list[int]
) -> list[FrontRow]:
    """Per sign (+ first), the front points by KL with the chosen one among them; ``method`` and ``layers`` are
    the calibrated artifact's own (the chosen candidate)."""
    rows: list[FrontRow] = []
    for sign, _, _ in SIGNS:
        these = [
            FrontRow(sign, tuple(p["layers"]), p["method"], p["strength"], p["kl"], p["behaviour_shift"])
            for p in front
            if p["strength"] * sign > 0
        ]
        side = calibration.get("positive" if sign > 0 else "negative")
        if side:
            these.append(
                FrontRow(
                    sign,
                    tuple(layers),
                    method,
                    side["strength"],
                    side["kl"],
                    side["behaviour_shift"] * sign,
                    chosen=True,
                )
            )
        rows += sorted(these, key=lambda row: (row.kl, not row.chosen))
    return rows


@dataclass(frozen=True)
class AblationRow:
    """One row of an ablation's front: a candidate's direction layer and weight profile, and what it measured."""

    direction_layer: int
    peak_weight: float
    peak_layer: float | None
    min_weight: float | None
    falloff: float | None
    refused: float
    """Share of the trait prompts still refused."""
    kl: float
    """Mean first-token KL from the unedited model."""
    chosen: bool = False

    def flags(self) -> str:
        """The row as ``generate`` takes it."""
        given = {"--peak-layer": self.peak_layer, "--min-weight": self.min_weight, "--falloff": self.falloff}
        rest = "".join(f" {flag} {value:.4g}" for flag, value in given.items() if value is not None)
        return f"--mode ablate --direction-layer {self.direction_layer} --peak-weight {self.peak_weight:.4g}{rest}"


def ablation_rows(calibration: dict[str, Any], front: list[dict[str, Any]]) -> list[AblationRow]:
    """The front's points and the chosen ablation (measured on every prompt), by KL."""
    record = calibration["ablation"]
    profile = record["profile"]
    chosen = AblationRow(
        record["direction_layer"],
        profile["peak_weight"],
        profile.get("peak_layer"),
        profile.get("min_weight"),
        profile.get("falloff"),
        record["trait_rate"],
        record["kl_first"],
        chosen=True,
    )
    rows = [
        AblationRow(
            p["direction_layer"],
            p["peak_weight"],
            p["peak_layer"],
            p["min_weight"],
            p["falloff"],
            p["trait_rate"],
            p["kl_first"],
        )
        for p in front
    ]
    return sorted([*rows, chosen], key=lambda row: (row.kl, not row.chosen))


class CalibrationView(Vertical):
    """A calibration's front: the table (enter adopts a row) and, on a wide screen, the plot beside it."""

    DEFAULT_CSS = """
    CalibrationView { height: 1fr; }
    CalibrationView #calibration-note { height: auto; padding: 0 1; color: $text-muted; }
    CalibrationView Horizontal { height: 1fr; }
    CalibrationView #front { width: auto; min-width: 30; max-width: 60%; height: 1fr; margin-right: 2;
                             scrollbar-gutter: stable; }
    CalibrationView #front-plot-box { width: 1fr; height: 1fr; }
    CalibrationView #front-plot-title { height: auto; padding: 0 1; }
    CalibrationView #front-plot { height: 1fr; min-height: 6; }
    """

    class Adopt(Message):
        """The person pressed enter on a row: the Generate tab should steer at that point."""

        def __init__(self, row: FrontRow) -> None:
            super().__init__()
            self.row = row

    class AdoptAblation(Message):
        """The person pressed enter on a row of an ablation's front."""

        def __init__(self, row: AblationRow) -> None:
            super().__init__()
            self.row = row

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: list[FrontRow] = []
        self.ablations: list[AblationRow] = []
        """An ablation's front, when one is shown (then ``rows`` is empty)."""
        self.budget = 0.0
        self.plot_widget: Any = None
        """The textual-plotext widget, once the first front has arrived."""

    def compose(self) -> ComposeResult:
        yield Static("", id="calibration-note")
        with Horizontal():
            yield DataTable(cursor_type="row", zebra_stripes=True, id="front")
            with Vertical(id="front-plot-box"):
                yield Static("", id="front-plot-title")

    def show(self, calibration: dict[str, Any], front: list[dict[str, Any]], method: str, layers: list[int]) -> None:
        """Fill the table and the plot from a calibration record and its front."""
        self.rows, self.budget = front_rows(calibration, front, method, layers), calibration["kl_budget"]
        self.query_one("#calibration-note", Static).update(
            f"front on screening sets; ✓ chosen on all {calibration['neutral_prompts']} prompts, "
            f"{calibration['holdout_pairs']} pairs; enter adopts"
        )
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("sign", "layers", "method", "strength", "KL", "moved", "")
        for at, row in enumerate(self.rows):
            style = "bold green" if row.chosen else ""
            sign = next(word for s, word, _ in SIGNS if s == row.sign)
            table.add_row(
                *(
                    Text(cell, style=style)
                    for cell in (
                        sign,
                        _layers(row.layers),
                        row.method,
                        row.shown_strength(),
                        f"{row.kl:.3f}",
                        f"{row.moved:+.3f}",
                        "✓ chosen" if row.chosen else "",
                    )
                ),
                key=str(at),
            )
        self.ablations = []
        self._finish(table, [row.chosen for row in self.rows], self._plot_title())
        sides = [[row for row in self.rows if row.sign == sign and not row.chosen] for sign, _, _ in SIGNS]
        self._draw(
            [([r.kl for r in side], [r.moved for r in side], colour) for side, (_, _, colour) in zip(sides, SIGNS)],
            [(row.kl, row.moved) for row in self.rows if row.chosen],
            "moved",
        )

    def show_ablation(self, calibration: dict[str, Any], front: list[dict[str, Any]]) -> None:
        """Fill the table and the plot from an ablation's record and its front."""
        record = calibration["ablation"]
        self.rows, self.budget = [], calibration["kl_budget"]
        self.ablations = ablation_rows(calibration, front)
        self.query_one("#calibration-note", Static).update(
            f"front on screening sets; ✓ chosen on all {record['trait_prompts']} trait and "
            f"{calibration['neutral_prompts']} neutral prompts; enter on ✓ ablates with it"
        )
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("layer", "weight", "peak", "min", "reach", "refused", "KL", "")
        for at, row in enumerate(self.ablations):
            style = "bold green" if row.chosen else ""
            cells = (
                str(row.direction_layer),
                f"{row.peak_weight:.2f}",
                _number(row.peak_layer, "{:.1f}"),
                _number(row.min_weight, "{:.2f}"),
                _number(row.falloff, "{:.1f}"),
                f"{row.refused:.0%}",
                f"{row.kl:.3f}",
                "✓ chosen" if row.chosen else "",
            )
            table.add_row(*(Text(cell, style=style) for cell in cells), key=str(at))
        title = Text.assemble(
            "refused against KL: ",
            ("front", "cyan"),
            ", ",
            (f"budget {self.budget:g}", "yellow"),
            ", ",
            ("● chosen", "bold green"),
        )
        self._finish(table, [row.chosen for row in self.ablations], title)
        others = [row for row in self.ablations if not row.chosen]
        self._draw(
            [([row.kl for row in others], [100 * row.refused for row in others], "cyan")],
            [(row.kl, 100 * row.refused) for row in self.ablations if row.chosen],
            "refused %",
            (0, 100),
        )

    def _finish(self, table: DataTable[Any], chosen: list[bool], title: Text) -> None:
        """The cursor on the chosen row, the plot's title, and the plot mounted (plotext imported) the first time."""
        if True in chosen:
            table.move_cursor(row=chosen.index(True))
        self.query_one("#front-plot-title", Static).update(title)
        if self.plot_widget is None:
            from textual_plotext import PlotextPlot

            self.plot_widget = PlotextPlot(id="front-plot")
            self.query_one("#front-plot-box").mount(self.plot_widget)

    def highlighted(self) -> FrontRow | None:
        table = self.query_one(DataTable)
        return self.rows[table.cursor_row] if self.rows and 0 <= table.cursor_row < len(self.rows) else None

    def highlighted_ablation(self) -> AblationRow | None:
        at = self.query_one(DataTable).cursor_row
        return self.ablations[at] if 0 <= at < len(self.ablations) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = self.highlighted()
        if row is not None:
            self.post_message(self.Adopt(row))
        ablation = self.highlighted_ablation()
        if ablation is not None:
            self.post_message(self.AdoptAblation(ablation))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()  # the front has one order (by KL within each sign); the candidate table's sort is not for it

    def _plot_title(self) -> Text:
        return Text.assemble(
            "moved against KL: ",
            ("+", "cyan"),
            " and ",
            ("−", "magenta"),
            ", ",
            (f"budget {self.budget:g}", "yellow"),
            ", ",
            ("● chosen", "bold green"),
        )

    def _draw(
        self,
        series: list[tuple[list[float], list[float], str]],
        chosen: list[tuple[float, float]],
        ylabel: str,
        ylim: tuple[float, float] | None = None,
    ) -> None:
        """Each series (KLs, values, colour) as a line over log KL, the chosen points marked, the budget a line;
        ``ylim`` fixes the value axis (a share in percent runs 0 to 100)."""
        plt = self.plot_widget.plt
        plt.clear_figure()
        kls = [kl for xs, _, _ in series for kl in xs if kl > 0] + [kl for kl, _ in chosen if kl > 0] + [self.budget]
        low, high = math.floor(math.log10(min(kls))), math.ceil(math.log10(max(kls)))
        if high == low:
            high += 1
        plt.vline(math.log10(self.budget), "yellow")  # first, so the series are drawn over it
        for xs, ys, colour in series:
            points = [(kl, y) for kl, y in zip(xs, ys) if kl > 0]
            if points:
                plt.plot(
                    [math.log10(kl) for kl, _ in points],
                    [y for _, y in points],
                    marker="braille" if len(points) > 1 else "●",
                    color=colour,
                )
        marked = [(kl, y) for kl, y in chosen if kl > 0]
        if marked:
            plt.scatter([math.log10(kl) for kl, _ in marked], [y for _, y in marked], marker="●", color="green")
        plt.xlim(low, high)
        if ylim is not None:
            plt.ylim(*ylim)
        places = list(range(low, high + 1))
        plt.xticks(places, [f"{10.0**p:g}" for p in places])
        plt.xlabel("mean KL (nats, log)")
        plt.ylabel(ylabel)
        self.plot_widget.refresh()


def _number(value: float | None, form: str) -> str:
    return "—" if value is None else form.format(value)


def _layers(layers: tuple[int, ...]) -> str:
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"
