"""The Generate pane's parts: the streaming text panels and the small formatters the sweep table shares."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static


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
