"""The status line under the title: model, precision, device, chat template, pair set, running job."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ster.tui.settings import Settings


class StatusLine(Static):
    """One line that says what the app is working on and what it is doing."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $text-muted;
        padding: 0 1;
    }
    """

    def show(self, settings: Settings, job: str) -> None:
        chat = settings.chat_template if settings.chat_decision is None else settings.chat_decision
        pairs = settings.pairs.name if settings.pairs else "none"
        text = Text()
        for label, value in (("model", settings.model), ("precision", settings.precision),
                             ("device", settings.device), ("chat template", chat), ("pairs", pairs),
                             ("job", job or "idle")):
            text.append(f"{label} ", style="dim")
            text.append(f"{value}  ", style="bold")
        self.update(text)
