"""Small modal screens: confirm a question, ask for one line of text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from ster.tui.widgets.fields import Field
from ster.tui.widgets.footer import KeyBar

DIALOG_CSS = """
.dialog {
    width: 72;
    max-width: 100%;
    height: auto;
    max-height: 100%;
    border: thick $accent;
    background: $surface;
    padding: 1 2;
}
.dialog > Label { width: 100%; }
.dialog > Horizontal { height: auto; margin-top: 1; }
.dialog Button { margin-right: 2; }
.dialog .error { color: $error; }
"""


class Confirm(ModalScreen[bool]):
    """A yes/no question; dismisses with True for yes."""

    DEFAULT_CSS = "Confirm { align: center middle; }" + DIALOG_CSS
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            with Horizontal():
                yield Button(f"{self.yes} (y)", variant="error", id="yes", compact=True)
                yield Button(f"{self.no} (n)", id="no", compact=True)
        yield KeyBar(app_keys=False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class AskText(ModalScreen[str | None]):
    """One line of text (a path, a name); dismisses with None when cancelled."""

    DEFAULT_CSS = "AskText { align: center middle; }" + DIALOG_CSS
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.question, self.value, self.placeholder = question, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question)
            yield Field(self.value, placeholder=self.placeholder, id="answer")
            with Horizontal():
                yield Button("OK (enter)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)
        yield KeyBar(app_keys=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self.query_one(Input).value.strip() or None if event.button.id == "ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


def replace_or_keep(
    app: App, path: Path, kind: str, what: str, go: Callable[[], None], say: Callable[[str, str], None]
) -> None:
    """Run ``go`` when ``path`` is free; ask first when it holds an older ``kind``; refuse anything else.

    The engine refuses to replace a document of another kind anyway; saying so here spares a
    question whose "yes" could only be refused.
    """
    from ster.engine.protocol.kinds import existing

    found = existing(path)
    if found is None or found.empty:
        go()
    elif found.kind == kind:
        app.push_screen(
            Confirm(f"{path} holds {found.phrase}. Replace it with {what}?", "Replace", "Keep it"),
            lambda yes: go() if yes else say(f"kept {path}; nothing ran. Name another file to keep both", "yellow"),
        )
    else:
        say(f"{path} holds {found.phrase}, which {what} never replaces: name another file", "red")
