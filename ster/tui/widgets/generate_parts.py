"""The Generate pane's parts: the streaming text panels, the sweep table, and the small formatters."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

SWEEP_COLUMNS = (("strength", 8), ("other", 8), ("effect", 8), ("dist-2", 6), ("run", 3), ("tokens", 6),
                 ("judged", 10))
"""The sweep table's short columns and widths; "other" is the strength in the other unit; the output takes the rest."""
NARROW_COLUMNS = ("strength", "other", "effect", "judged")
"""The short columns kept below 100 cells, so the output stays readable (the row's dialog has every measure)."""
OUTPUT = "output (enter: all of it)"


def mean(values: dict[str, float] | None) -> float | None:
    """One number for a per-layer mapping (strength per layer): the mean over layers; None when empty."""
    return sum(values.values()) / len(values) if values else None


def other_unit(data: dict[str, Any]) -> str:
    """A steered result's strength in the unit it was not given in: ``= 12.3 absolute`` or ``= 0.29x``."""
    if data.get("strength_unit") == "relative":
        value = mean(data.get("absolute_strength"))
        return "" if value is None else f"= {value:.3g} absolute"
    value = mean(data.get("relative_strength"))
    return "" if value is None else f"= {value:.2g}x"


def one_line(text: str, width: int) -> str:
    """A generated text cut to one table cell: newlines shown as ⏎, the tail replaced by an ellipsis."""
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


class TextPanel(VerticalScroll):
    """One generated text, streamed token by token, under a title that says how it was steered."""

    DEFAULT_CSS = """
    TextPanel { width: 1fr; height: 1fr; border: round $secondary; padding: 0 1; }
    TextPanel.running { border: round $accent; }
    TextPanel:focus { border: round $primary; }
    """

    def __init__(self, title: str, hint: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title, self.hint = title, hint
        self.title = title
        self.text = ""
        """What the job's token events have streamed so far."""

    def compose(self) -> ComposeResult:
        yield Static(Text(self.hint, style="dim"))

    def reset(self, title: str, note: str) -> None:
        self.title, self.border_title, self.border_subtitle, self.text = title, title, "", ""
        self.note(note)

    def retitle(self, title: str) -> None:
        self.title = self.border_title = title

    def mark(self, state: str) -> None:
        """Put a word before the title (cancelled, refused, or why the text is now older than the settings),
        where a narrow panel does not cut it off."""
        self.border_title = f"({state}) {self.title}"

    def note(self, note: str, style: str = "dim") -> None:
        """A line in place of the text, for a panel that has none yet (queued, not run)."""
        self.query_one(Static).update(Text(note, style=style))

    def append(self, delta: str) -> None:
        self.text += delta
        self.query_one(Static).update(Text(self.text))
        self.scroll_end(animate=False)


class SweepTable(DataTable):
    """One row per strength of a sweep: its output streams in while it runs, its measures fill in at the end."""

    DEFAULT_CSS = "SweepTable { height: 1fr; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.texts: dict[str, str] = {}
        """Per row (keyed by the sweep's stream label, ``+0.4x/0``), what the token events have streamed."""
        self.strengths: dict[str, str] = {}
        """Per row, its strength as the strength field writes it (``0.4x``)."""
        self.rows_data: dict[str, dict[str, Any]] = {}
        """Per row, the sweep result's row, once the sweep has ended."""
        self.unit = "relative"
        self.result: dict[str, Any] | None = None

    def on_mount(self) -> None:
        self._columns()

    def on_resize(self) -> None:
        """The output column takes the width the others leave, so a new width lays the table out again."""
        if self.result is not None:
            self.fill(self.result)
        elif not self.texts:
            self._columns()

    def _columns(self) -> None:
        self.clear(columns=True)
        other = "absolute" if self.unit == "relative" else "relative"
        shown = [(label, width) for label, width in SWEEP_COLUMNS
                 if self.size.width >= 100 or label in NARROW_COLUMNS]
        rest = max(10, self.size.width - sum(width + 2 for _, width in shown) - 4)
        for label, width in (*shown, (OUTPUT, rest)):
            self.add_column(other if label == "other" else label, width=width, key=label)

    def begin(self, strengths: list[Any]) -> None:
        """A waiting row per strength (engine ``Strength`` objects), so the outputs can stream into place."""
        self.unit = strengths[0].unit
        self._columns()
        self.texts = {f"{s.signed()}/0": "" for s in strengths}
        self.strengths = {f"{s.signed()}/0": str(s) for s in strengths}
        self.rows_data, self.result = {}, None
        for strength in strengths:
            cells = {"strength": Text(shown_signed(strength), justify="right"),
                     "judged": "baseline" if strength.value == 0 else "", OUTPUT: ""}
            self.add_row(*(cells.get(str(key.value), Text("…", justify="right")) for key in self.columns),
                         key=f"{strength.signed()}/0")

    def stream(self, label: str, delta: str) -> None:
        if label in self.texts:
            self.texts[label] += delta
            self.update_cell(label, OUTPUT, one_line(self.texts[label], self._rest()))

    def fill(self, data: dict[str, Any]) -> None:
        """The sweep's rows, the suggested strengths in bold with a marker."""
        from ster.engine.steering.strength import Strength

        self.unit, self.result = data["strength_unit"], data
        cursor = self.cursor_row
        self._columns()
        suggested = {data["suggested"]["positive"], data["suggested"]["negative"]} - {None}
        for row in data["rows"]:
            strength = Strength(value=row["strength"], unit=data["strength_unit"])
            key = f"{strength.signed()}/0"
            self.rows_data[key], self.strengths[key] = row, str(strength)
            cells = sweep_cells(row, strength, row["strength"] in suggested, self._rest())
            self.add_row(*(cells[str(column.value)] for column in self.columns), key=key)
        self.move_cursor(row=min(cursor, self.row_count - 1), animate=False)

    def highlighted_key(self) -> str | None:
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)

    def _rest(self) -> int:
        return int(self.columns[OUTPUT].width)  # type: ignore[index]


def shown_signed(strength: Any) -> str:
    """A sweep strength as its row shows it: signed (``+0.4x``), the baseline as a plain 0."""
    return "0" if strength.value == 0 else strength.signed()


def sweep_cells(row: dict[str, Any], strength: Any, suggested: bool, width: int) -> dict[str, Text]:
    """A result row's cells by column key (the table shows the columns its width allows)."""
    style = "bold green" if suggested else ""
    other = mean(row["absolute_strength"]) if strength.relative else mean(row["relative_strength"])
    judged = ("baseline" if row["strength"] == 0 else "fluent ◀" if suggested else
              "fluent" if row["fluent"] else "not fluent")
    numbers = {"strength": shown_signed(strength), "other": cell(other, ".3g"), "effect": cell(row["effect"], "+.3f"),
               "dist-2": cell(row["distinct_2"], ".2f"), "run": str(row["longest_run"]),
               "tokens": f"{row['mean_tokens']:.1f}"}
    output = one_line(" | ".join(o["text"] for o in row["outputs"]), width)
    return {**{key: Text(n, style=style, justify="right") for key, n in numbers.items()},
            "judged": Text(judged, style=style or ("red" if not row["fluent"] else "")),
            OUTPUT: Text(output, style=style)}


def sweep_caption(data: dict[str, Any], artifact: str) -> Text:
    """What was swept and what it suggests, and what effect means: its unit and which sign is the trait's."""
    suggested = data["suggested"]
    unit = "x" if data["strength_unit"] == "relative" else ""
    picks = [f"{suggested[sign]:+g}{unit}" for sign in ("positive", "negative") if suggested[sign] is not None]
    caption = Text(f"swept {artifact} on {data['model']}. ", style="bold")
    caption.append(f"suggested: {', '.join(picks) or 'none'}. ")
    caption.append(f"effect: how far the text moved along the direction, read back unsteered, minus the "
                   f"baseline's (residual-stream units): + toward {data['trait_name']}, − away.", style="")
    return caption


def fluent_rule(data: dict[str, Any]) -> Text:
    bound = data["bound"]
    return Text(f"fluent = distinct-2 ≥ {bound['distinct_2_ratio']:g}× the baseline's, longest run ≤ baseline's + "
                f"{bound['longest_run_slack']}, mean tokens ≥ {bound['length_ratio']:g}× the baseline's. "
                "enter on a row shows its full outputs.", style="dim")
