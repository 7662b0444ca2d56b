"""Switching the model, or how it is loaded, from inside the app."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Select

from ster.tui.screens.dialogs import DIALOG_CSS
from ster.tui.settings import Settings
from ster.tui.widgets.fields import Field
from ster.tui.widgets.footer import KeyBar


class ModelDialog(ModalScreen[dict[str, str] | None]):
    """Model, precision, device and chat template; dismisses with the new values, or None."""

    DEFAULT_CSS = "ModelDialog { align: center middle; } ModelDialog Select { width: 1fr; }" + DIALOG_CSS
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(classes="dialog"):
            yield Label("Model: a checkpoint directory, a Hugging Face Hub id, or ster:toy / ster:toy-chat")
            yield Field(s.model, id="model")
            with Horizontal():
                yield Select(
                    [(p, p) for p in ("f32", "f16", "bf16", "int8")],
                    value=s.precision,
                    allow_blank=False,
                    compact=True,
                    id="precision",
                )
                yield Select(
                    [(d, d) for d in ("cpu", "cuda", "mps", "auto")],
                    value=s.device,
                    allow_blank=False,
                    compact=True,
                    id="device",
                )
                yield Select(
                    [("chat template auto", "auto"), ("chat template off", "off")],
                    value=s.chat_template,
                    allow_blank=False,
                    compact=True,
                    id="chat_template",
                )
            with Horizontal():
                yield Button("Use (enter)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)
        yield KeyBar(app_keys=False)

    def on_input_submitted(self) -> None:
        self._done()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._done()
        else:
            self.dismiss(None)

    def _done(self) -> None:
        model = self.query_one("#model", Field).value.strip()
        if not model:
            self.notify("give a model", severity="error")
            return
        values = {
            name: str(self.query_one(f"#{name}", Select).value) for name in ("precision", "device", "chat_template")
        }
        self.dismiss({"model": model, **values})

    def action_cancel(self) -> None:
        self.dismiss(None)
