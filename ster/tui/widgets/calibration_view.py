"""The Train pane's calibration view: the Pareto front of behaviour moved against KL, as a table and a plot.

Shown when a ``calibrate`` job finishes and when an artifact with a ``calibration`` record is
loaded (its front is computed from the record's trials with the engine's own ``pareto``, which
imports no torch). The table holds, per sign, every front point (the screening sets' ladder)
and the chosen strength measured on the whole sets, marked ``✓ chosen``; ``enter`` on a row asks
the pane to adopt it (:class:`CalibrationView.Adopt`). Beside it on a wide screen the plot:
x is the mean KL from the unsteered model (nats, log scale), y the behaviour moved toward the
sign, one series per sign, the KL budget a vertical line and the chosen points marked. Like the
other plots, plotext is imported when the first front arrives, never for the first paint.
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

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: list[FrontRow] = []
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
        chosen = next((at for at, row in enumerate(self.rows) if row.chosen), None)
        if chosen is not None:
            table.move_cursor(row=chosen)
        self.query_one("#front-plot-title", Static).update(self._plot_title())
        if self.plot_widget is None:
            from textual_plotext import PlotextPlot

            self.plot_widget = PlotextPlot(id="front-plot")
            self.query_one("#front-plot-box").mount(self.plot_widget)
        self._draw()

    def highlighted(self) -> FrontRow | None:
        table = self.query_one(DataTable)
        return self.rows[table.cursor_row] if self.rows and 0 <= table.cursor_row < len(self.rows) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = self.highlighted()
        if row is not None:
            self.post_message(self.Adopt(row))

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

    def _draw(self) -> None:
        plt = self.plot_widget.plt
        plt.clear_figure()
        kls = [row.kl for row in self.rows if row.kl > 0] + [self.budget]
        low, high = math.floor(math.log10(min(kls))), math.ceil(math.log10(max(kls)))
        if high == low:
            high += 1
        plt.vline(math.log10(self.budget), "yellow")  # first, so the series are drawn over it
        for sign, _, colour in SIGNS:
            points = [row for row in self.rows if row.sign == sign and not row.chosen and row.kl > 0]
            if points:
                plt.plot(
                    [math.log10(row.kl) for row in points],
                    [row.moved for row in points],
                    marker="braille" if len(points) > 1 else "●",
                    color=colour,
                )
        chosen = [row for row in self.rows if row.chosen and row.kl > 0]
        if chosen:
            plt.scatter(
                [math.log10(row.kl) for row in chosen], [row.moved for row in chosen], marker="●", color="green"
            )
        plt.xlim(low, high)
        places = list(range(low, high + 1))
        plt.xticks(places, [f"{10.0**p:g}" for p in places])
        plt.xlabel("mean KL (nats, log)")
        plt.ylabel("moved")
        self.plot_widget.refresh()


def _layers(layers: tuple[int, ...]) -> str:
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"
