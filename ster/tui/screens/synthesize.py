"""The form that starts ``pairs synthesize``: a trait, a count, who writes, where it goes.

It returns the form's text as typed; the engine's request model refuses a count that
is not a number, and the job refuses a missing route or model in its own sentence, so
the pane shows the same refusal the CLI would print.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Select

from ster.tui.screens.dialogs import DIALOG_CSS
from ster.tui.widgets.fields import Field
from ster.tui.widgets.footer import KeyBar

REQUIRED = ("trait", "count", "output")
"""The fields the form will not return empty; the route is needed only on the Brama route."""


class SynthesizeDialog(ModalScreen[dict[str, str] | None]):
    """Dismisses with {trait, count, generator, generator_model, output} as strings, or None."""

    DEFAULT_CSS = (
        """
    SynthesizeDialog { align: center middle; }
    SynthesizeDialog .dialog { width: 90; max-width: 95%; }
    SynthesizeDialog .row Label { width: 18; padding: 0 1 0 0; }
    SynthesizeDialog .row Field { width: 1fr; }
    SynthesizeDialog .row Select { width: 1fr; }
    SynthesizeDialog .dialog .row { margin-top: 0; }
    """
        + DIALOG_CSS
    )
    BINDINGS = [
        Binding("ctrl+s", "start", "Start", tooltip="Start synthesizing"),
        Binding("escape", "cancel", "Cancel", tooltip="Close without starting"),
    ]

    def __init__(self, local_model: str, output: str) -> None:
        super().__init__()
        self.local_model, self.output = local_model, output

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Synthesize a pair set from a one-sentence trait description")
            yield from _row("trait", Field(placeholder="e.g. calm and reassuring", id="trait"))
            yield from _row("pairs to keep", Field("8", type="integer", id="count"))
            yield from _row(
                "generator",
                Select(
                    [(f"local ({self.local_model})", "local"), ("brama", "brama")],
                    value="local",
                    allow_blank=False,
                    compact=True,
                    id="generator",
                ),
            )
            yield from _row(
                "brama route",
                Field(placeholder="provider/model, e.g. openai/gpt-5-mini", id="generator_model", disabled=True),
            )
            yield from _row("write to", Field(self.output, id="output"))
            yield Label("", classes="error", id="error")
            with Horizontal():
                yield Button("Start (ctrl+s)", variant="primary", id="start", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)
        yield KeyBar(app_keys=False)

    def on_mount(self) -> None:
        self.query_one("#trait", Field).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        """The route box only means something on the Brama route; the local one uses the app's model."""
        self.query_one("#generator_model", Field).disabled = event.value != "brama"

    def on_input_submitted(self) -> None:
        self.action_start()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_start() if event.button.id == "start" else self.action_cancel()

    def action_start(self) -> None:
        values = {name: self.query_one(f"#{name}", Field).value.strip() for name in (*REQUIRED, "generator_model")}
        values["generator"] = str(self.query_one("#generator", Select).value)
        missing = [name for name in REQUIRED if not values[name]]
        if missing:
            self.query_one("#error", Label).update(f"fill in: {', '.join(missing)}")
            return
        self.dismiss(values)

    def action_cancel(self) -> None:
        self.dismiss(None)


def _row(label: str, field: Field | Select[str]) -> ComposeResult:
    """One labelled field on a line."""
    with Horizontal(classes="row"):
        yield Label(label)
        yield field
