"""The Generate pane's parts: the streaming text panels, the sweep table, and the small formatters."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Input, Static

STEP_KEYS = frozenset("[]{}")
SWEEP_COLUMNS = (("strength", "strength"), ("relative", "relative"), ("effect", "effect"),
                 ("distinct-2", "distinct_2"), ("longest run", "longest_run"), ("mean tokens", "mean_tokens"),
                 ("fluent", "fluent"), ("", "mark"), ("output", "output"))
OUTPUT_CHARS = 56
FAILED = {"refused": "refused", "cancelled": "cancelled", "internal": "failed"}


def mean_relative(relative: dict[str, float] | None) -> float | None:
    """One number for how hard the push is against the residual stream: the mean over the steered
    layers of strength / activation norm (None when no layer records a norm)."""
    return sum(relative.values()) / len(relative) if relative else None


def relative_label(relative: float | None) -> str:
    return "relative unknown" if relative is None else f"relative {relative:.3g}"


def one_line(text: str, width: int = OUTPUT_CHARS) -> str:
    """A generated text cut to one table cell: newlines shown as ⏎, the tail replaced by an ellipsis."""
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def stream_label(strength: float) -> str:
    """The sweep job's ``stream`` for a strength's output on the pane's single prompt."""
    return f"{strength:+g}/0"


def shown(typed: str) -> str:
    """A typed number as the engine will read it (3.0 shows as 3); anything else as typed."""
    try:
        return f"{float(typed):g}"
    except ValueError:
        return typed


def cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


class StepInput(Input):
    """A number field that leaves the strength-step keys to the pane, so they work while it has focus."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character not in STEP_KEYS and super().check_consume_key(key, character)

    async def _on_key(self, event: events.Key) -> None:
        if event.character in STEP_KEYS:
            event.prevent_default()  # Input would type it; unhandled, it bubbles to the pane's bindings


class TextPanel(VerticalScroll):
    """One generated text, streamed token by token, under a title that says how it was steered."""

    DEFAULT_CSS = """
    TextPanel { width: 1fr; height: 1fr; border: round $secondary; padding: 0 1; }
    TextPanel.running { border: round $accent; }
    """

    def __init__(self, title: str, hint: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title, self.hint = title, hint
        self.text = ""
        """What the job's token events have streamed so far."""

    def compose(self) -> ComposeResult:
        yield Static(Text(self.hint, style="dim"))

    def reset(self, title: str, note: str) -> None:
        self.border_title, self.border_subtitle, self.text = title, "", ""
        self.note(note)

    def note(self, note: str, style: str = "dim") -> None:
        """A line in place of the text, for a panel that has none yet (queued, not run)."""
        self.query_one(Static).update(Text(note, style=style))

    def append(self, delta: str) -> None:
        self.text += delta
        self.query_one(Static).update(Text(self.text))
        self.scroll_end(animate=False)


class SweepTable(DataTable):
    """One row per strength of a sweep: its output streams in while it runs, its measures fill in at the end."""

    DEFAULT_CSS = "SweepTable { height: 1fr; min-height: 5; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.texts: dict[str, str] = {}
        """Per row (keyed by the sweep's stream label), what the token events have streamed so far."""
        self.strengths: dict[str, float] = {}

    def on_mount(self) -> None:
        for label, key in SWEEP_COLUMNS:
            self.add_column(label, key=key)

    def begin(self, strengths: list[float]) -> None:
        """A waiting row per strength, so the outputs can stream into place."""
        self.clear()
        self.texts = {stream_label(s): "" for s in strengths}
        self.strengths = {stream_label(s): s for s in strengths}
        for strength in strengths:
            self.add_row(f"{strength:+g}", *["…"] * 6, "baseline" if strength == 0 else "", "",
                         key=stream_label(strength))

    def stream(self, label: str, delta: str) -> None:
        if label in self.texts:
            self.texts[label] += delta
            self.update_cell(label, "output", one_line(self.texts[label]))

    def fill(self, data: dict[str, Any]) -> None:
        """The sweep's rows, the suggested strengths in bold with a marker."""
        self.clear()
        suggested = {data["suggested"]["positive"], data["suggested"]["negative"]} - {None}
        for row in data["rows"]:
            self.add_row(*sweep_cells(row, row["strength"] in suggested), key=stream_label(row["strength"]))


def sweep_cells(row: dict[str, Any], suggested: bool) -> list[Text]:
    style = "bold green" if suggested else ""
    mark = "◀ suggested" if suggested else "baseline" if row["strength"] == 0 else ""
    numbers = [f"{row['strength']:+g}", cell(mean_relative(row["relative_strength"]), "+.3f"),
               cell(row["effect"], "+.3f"), cell(row["distinct_2"], ".2f"), str(row["longest_run"]),
               f"{row['mean_tokens']:.1f}"]
    fluent = Text("yes" if row["fluent"] else "no", style=style if row["fluent"] else "red")
    output = one_line(" | ".join(o["text"] for o in row["outputs"]))
    return [*(Text(n, style=style, justify="right") for n in numbers), fluent, Text(mark, style=style),
            Text(output, style=style)]


def sweep_caption(data: dict[str, Any]) -> Text:
    """The degeneracy bound the fluent column was judged by, and the suggestion it led to."""
    bound, suggested = data["bound"], data["suggested"]
    picks = ", ".join(f"{sign} {cell(suggested[sign], '+g')}" for sign in ("positive", "negative"))
    caption = Text(f"{data['trait_name']} at layer(s) {', '.join(map(str, data['layers']))}. ", style="bold")
    caption.append(f"fluent = distinct-2 ≥ {bound['distinct_2_ratio']:g}× the baseline's, longest run ≤ "
                   f"baseline's + {bound['longest_run_slack']}, mean tokens ≥ {bound['length_ratio']:g}× the "
                   f"baseline's. suggested: {picks}. enter on a row takes its strength.")
    return caption


