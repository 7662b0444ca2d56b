"""The Generate pane's parts: the streaming text panels and the small formatters its titles, captions and sweep
table share."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ster.tui.settings import layer_words
from ster.tui.words import format_number

NOUNS = {"add": "strength", "ablate": "weight", "clamp": "target"}
"""What a strength is in each mode, as the sweep table's column and its row dialog name it."""


def mean(values: dict[str, float] | None) -> float | None:
    """One number for a per-layer mapping (strength per layer): the mean over layers; None when empty."""
    return sum(values.values()) / len(values) if values else None


def other_unit(data: dict[str, Any]) -> str:
    """A steered result's strength in the unit it was not given in: ``= 12.3 absolute`` or ``= 0.51x``."""
    if data.get("strength_unit") == "relative":
        value = mean(data.get("absolute_strength"))
        return "" if value is None else f"= {value:.3g} absolute"
    value = mean(data.get("relative_strength"))
    return "" if value is None else f"= {value:.2g}x"


def applied(mode: str, strength: str) -> str:
    """What a steered run did, as its panel's title says it: ``steered 0.4x``, ``ablated (weight 1)``,
    ``clamped to 0.4x``."""
    return {"add": f"steered {strength}", "ablate": f"ablated (weight {strength})", "clamp": f"clamped to {strength}"}[
        mode
    ]


def mode_words(mode: str) -> str:
    """How the sweep's caption says what its strengths were: nothing for steering (what a sweep is)."""
    return {"add": "", "ablate": ", ablated at each weight,", "clamp": ", clamped to each target,"}[mode]


def shown_value(value: float, unit: str, mode: str, signed: bool = True) -> str:
    """A strength of a result (a sweep's suggestion, a row) as the pane writes it: ``+0.4x``, ``-3``; an
    ablation's weight unsigned (``0.5``), since it has no direction."""
    text = f"{value:{'+' if signed and mode != 'ablate' else ''}g}"
    return f"{text}x" if unit == "relative" else text


def edit_words(data: dict[str, Any]) -> str:
    """Where an ablation or a clamp edited the stream, from a generate result's ``edits``, short: ``embedding
    + blocks 0–3, layer 2's direction``, a clamp's target in the residual stream's units first (``= 2.2
    absolute at …``), and the weights where a profile made them differ; empty for steering."""
    edits: dict[str, dict[str, Any]] = data.get("edits") or {}
    if not edits:
        return ""
    blocks = sorted(int(site) for site in edits if site != "embedding")
    where = ["embedding"] if "embedding" in edits else []
    where += ["block" + layer_words(blocks).removeprefix("layer")] if blocks else []
    layers = sorted({edit["direction_layer"] for edit in edits.values()})
    whose = f"{layer_words(layers)}'s direction" if len(layers) == 1 else f"{layer_words(layers)}' directions"
    said = f"{' + '.join(where)}, {whose}"
    weights = sorted({edit["weight"] for edit in edits.values()})
    if len(weights) > 1:
        said += f", weights {format_number(weights[0])}–{format_number(weights[-1])}"
    if data.get("mode") == "clamp":
        targets = sorted({edit["target"] for edit in edits.values()})
        span = f"{targets[0]:.3g}" if len(targets) == 1 else f"{targets[0]:.3g}–{targets[-1]:.3g}"
        said = f"= {span} absolute at {said}"
    return said


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
        self.hint, self.title, self.state = hint, title, ""
        self.border_title = title
        self.text = ""
        """What the job's token events have streamed so far."""
        self.body = Text(hint, style="dim")
        """What the panel shows under its title: the text, or a note in its place."""
        self.whole_title: str | None = None
        """The title, when the border cannot hold it even shortened: then the body's first line carries it."""

    def compose(self) -> ComposeResult:
        yield Static(self.body)

    def reset(self, title: str, note: str) -> None:
        self.title, self.state, self.border_subtitle, self.text = title, "", "", ""
        self._show_title()
        self.note(note)

    def retitle(self, title: str) -> None:
        self.title = title
        self._show_title()

    def mark(self, state: str) -> None:
        """Put a word before the title (cancelled, refused, or why the text is now older than the settings),
        where a narrow panel does not cut it off."""
        self.state = state
        self._show_title()

    def on_resize(self) -> None:
        self._show_title()

    def _show_title(self) -> None:
        """The title, less the artifact's ``(method, layers)`` when the border has no room for all of it (the
        status line names the artifact whole), so the strength, the artifact's name and what it steers on stay
        readable."""
        full = f"({self.state}) {self.title}" if self.state else self.title
        room = self.outer_size.width - 6  # the border's corners and the spaces around the title
        short = full if room <= 0 or len(full) <= room else re.sub(r" \([^()]*\)( on |$)", r"\1", full)
        self.border_title = short
        whole = full if room > 0 and len(short) > room else None  # cut even so: say it whole inside
        if whole != self.whole_title:
            self.whole_title = whole
            self._show_body()

    def note(self, note: str, style: str = "dim") -> None:
        """A line in place of the text, for a panel that has none yet (queued, not run)."""
        self.body = Text(note, style=style)
        self._show_body()

    def append(self, delta: str) -> None:
        self.text += delta
        self.body = Text(self.text)
        self._show_body()

    def _show_body(self) -> None:
        shown = self.body if self.whole_title is None else Text.assemble((self.whole_title, "dim"), "\n", self.body)
        for static in self.query(Static):  # none before the panel is composed, which shows the body as it is then
            static.update(shown)
        self.scroll_end(animate=False)
