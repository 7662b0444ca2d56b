"""The dialog that shows a finished job's result document whole: what ``ster <command>`` prints, as JSON.

The Jobs table says only that a job finished; a tune run's report (every epoch, the final
loss, the adapter's path) and any other job's document are here in full, pretty-printed
and scrollable. ``escape`` closes it.
"""

from __future__ import annotations

import json
from typing import Any

from rich.highlighter import JSONHighlighter
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ster.tui.widgets.footer import KeyBar


def pretty(data: dict[str, Any]) -> str:
    """A result document as indented JSON (a path or other non-JSON value as its text)."""
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


class JobResultScreen(ModalScreen[None]):
    """One job's result document, scrollable; the title names the job."""

    DEFAULT_CSS = """
    JobResultScreen { align: center middle; }
    JobResultScreen VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%; margin: 1 0 2 0;
                                     border: thick $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,enter", "close", "Close")]

    def __init__(self, title: str, data: dict[str, Any]) -> None:
        super().__init__()
        self.title_text = title
        self.document = pretty(data)
        """The document as shown (plain text, for tests and a person's copy)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = self.title_text
            yield Static(JSONHighlighter()(Text(self.document)), id="document")
        yield KeyBar(app_keys=False)

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()  # the arrows and page keys scroll it at once

    def action_close(self) -> None:
        self.dismiss(None)
