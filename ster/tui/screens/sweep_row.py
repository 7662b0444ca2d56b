"""The dialog that shows one sweep row in full: its strength per layer, its measures, every output whole.

The table cuts each output to one cell, and the end of a text is often where steering
shows (or where it degenerates). Here the outputs are whole and scrollable; ``u`` takes
the row's strength into the form, ``c`` copies the outputs.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ster.tui.widgets.footer import KeyBar

Answer = str | None
"""``"use"`` to take the row's strength into the form; None to close."""


class SweepRowDialog(ModalScreen[Answer]):
    """One sweep row; ``row`` is the result's row, or None while the sweep still runs (then ``streamed``)."""

    DEFAULT_CSS = """
    SweepRowDialog { align: center middle; }
    SweepRowDialog VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%; margin: 1 0 2 0;
                                    border: thick $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [
        Binding("u", "use", "Use strength", tooltip="Take this row's strength into the form; g generates at it"),
        Binding("c", "copy", "Copy", tooltip="Copy this row's outputs"),
        Binding("escape,q,enter", "close", "Close"),
    ]

    def __init__(self, strength: str, row: dict[str, Any] | None, streamed: str, trait: str) -> None:
        super().__init__()
        self.strength, self.row, self.streamed, self.trait = strength, row, streamed, trait

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"sweep row at strength {self.strength}"
            if self.row is None:
                yield Static(Text("still running; what has streamed so far:", style="dim"))
                yield Static(Text(self.streamed))
            else:
                yield Static(measures(self.row, self.trait))
                for index, output in enumerate(self.row["outputs"]):
                    yield Static(Text.assemble((f"\nprompt {index}: ", "bold"), output["prompt"]))
                    yield Static(Text(output["text"] or "(empty: the model ended the text at once)"))
                    yield Static(Text(f"{output['tokens']} tokens, stopped at "
                                      f"{output['stop_reason'].replace('_', ' ')}", style="dim"))
        yield KeyBar(app_keys=False)

    def text(self) -> str:
        """The outputs as plain text, for the clipboard."""
        if self.row is None:
            return self.streamed
        return "\n\n".join(output["text"] for output in self.row["outputs"])

    def action_use(self) -> None:
        self.dismiss("use")

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text())
        self.notify(f"copied the outputs at strength {self.strength}")

    def action_close(self) -> None:
        self.dismiss(None)


def measures(row: dict[str, Any], trait: str) -> Table:
    """The row's numbers, each with what it means."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    per_layer = ", ".join(f"layer {layer}: {value:.4g}" for layer, value in row["absolute_strength"].items())
    relative = ", ".join(f"layer {layer}: {value:.3g}x" for layer, value in row["relative_strength"].items())
    effect = "—" if row["effect"] is None else f"{row['effect']:+.4f}"
    table.add_row("absolute", f"{per_layer} (the push added to the residual stream)")
    table.add_row("relative", f"{relative or '—'} (the push over the layer's activation norm)")
    table.add_row("effect", f"{effect}: how far the text moved along the direction, read back by the unsteered "
                            f"model, minus the baseline's, in residual-stream units; + toward {trait}, − away")
    distinct = "—" if row["distinct_2"] is None else f"{row['distinct_2']:.2f}"
    table.add_row("degeneracy", f"distinct-2 {distinct}, longest run {row['longest_run']}, mean tokens "
                                f"{row['mean_tokens']:.1f}: {'fluent' if row['fluent'] else 'not fluent'}")
    return table
