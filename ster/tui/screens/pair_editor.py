"""The modal that writes or rewrites one pair: a positive and a negative text.

It checks only that both sides hold text, so the person is not sent back from a save
for an empty box; every other judgement (duplicates, refusals, balance, the document's
shape) belongs to the engine's inspect and save jobs.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, TextArea

from ster.tui.screens.dialogs import DIALOG_CSS
from ster.tui.widgets.footer import KeyBar

PairTexts = tuple[str, str]
"""(positive, negative) without surrounding whitespace: a TextArea makes a stray trailing newline easy."""


class PairEditor(ModalScreen[PairTexts | None]):
    """Two multi-line boxes; dismisses with (positive, negative), or None when cancelled."""

    DEFAULT_CSS = (
        """
    PairEditor { align: center middle; }
    PairEditor .dialog { width: 100; max-width: 95%; }
    PairEditor TextArea { height: 6; background: $boost; }
    PairEditor .side { margin-top: 1; }
    """
        + DIALOG_CSS
    )
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Keep this pair"),
        Binding("escape", "cancel", "Cancel", tooltip="Close without changing the set"),
    ]

    def __init__(self, title: str, positive: str = "", negative: str = "") -> None:
        super().__init__()
        self.title_text, self.positive, self.negative = title, positive, negative

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text)
            yield Label("positive: the text that shows the trait", classes="side")
            yield TextArea(self.positive, id="positive", compact=True)
            yield Label("negative: the same text without it", classes="side")
            yield TextArea(self.negative, id="negative", compact=True)
            yield Label("", classes="error", id="error")
            with Horizontal():
                yield Button("Save (ctrl+s)", variant="primary", id="save", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)
        yield KeyBar(app_keys=False)

    def on_mount(self) -> None:
        """Start typing where an edit most often goes: after the existing text."""
        box = self.query_one("#positive", TextArea)
        box.move_cursor(box.document.end)
        box.focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_save() if event.button.id == "save" else self.action_cancel()

    def action_save(self) -> None:
        positive = self.query_one("#positive", TextArea).text.strip()
        negative = self.query_one("#negative", TextArea).text.strip()
        if not positive or not negative:
            self.query_one("#error", Label).update("write both sides: a pair needs a positive and a negative text")
            return
        self.dismiss((positive, negative))

    def action_cancel(self) -> None:
        self.dismiss(None)
