"""The dialog that shows one sweep row in full: its strength per layer, its measures, every output whole.

The table cuts each output to one cell, and the end of a text is often where steering
shows (or where it degenerates). Here the outputs are whole and scrollable, each with its
own effect; the measures say what the effect is, its noise over the prompts and whether
it can be told apart from that noise. ``u`` takes the row's strength into the form, ``c``
copies the outputs.
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
from ster.tui.widgets.generate_parts import NOUNS
from ster.tui.widgets.sweep_table import number, row_text, verdict

Answer = str | None
"""``"use"`` to take the row's strength into the form; None to close."""


class SweepRowDialog(ModalScreen[Answer]):
    """One sweep row; ``row`` is the result's row, or None while the sweep still runs (then ``streamed``);
    ``mode`` is what the sweep did with the direction (its strength a push, a weight or a target)."""

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

    def __init__(self, strength: str, row: dict[str, Any] | None, streamed: str, trait: str, mode: str = "add") -> None:
        super().__init__()
        self.strength, self.row, self.streamed, self.trait, self.mode = strength, row, streamed, trait, mode

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"sweep row at {NOUNS[self.mode]} {self.strength}"
            if self.row is None:
                yield Static(Text("still running; what has streamed so far:", style="dim"))
                yield Static(Text(self.streamed))
            else:
                yield Static(measures(self.row, self.trait, self.mode, self.strength))
                for index, output in enumerate(self.row["outputs"]):
                    yield Static(Text.assemble((f"\nprompt {index + 1}: ", "bold"), output["prompt"]))
                    yield Static(Text(output["text"] or "(empty: the model ended the text at once)"))
                    yield Static(
                        Text(
                            f"{output['tokens']} tokens, stopped at "
                            f"{output['stop_reason'].replace('_', ' ')}"
                            f"{output_effect(output) if self.row['strength'] else ''}",
                            style="dim",
                        )
                    )
        yield KeyBar(app_keys=False)

    def text(self) -> str:
        """The outputs as plain text, for the clipboard."""
        return self.streamed if self.row is None else row_text(self.row)

    def action_use(self) -> None:
        self.dismiss("use")

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text())
        self.notify(f"copied the outputs at strength {self.strength}")

    def action_close(self) -> None:
        self.dismiss(None)


EDITS = {
    "ablate": "that share of the component along the direction removed at each site (1: all of it)",
    "clamp": "the component along the direction set to it at each site (x: times the spread of the layer whose "
    "direction is used)",
}
"""What an ablation's weight and a clamp's target do, as the row's dialog says it."""


def measures(row: dict[str, Any], trait: str, mode: str = "add", strength: str = "") -> Table:
    """The row's numbers, each with what it means."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    if mode in EDITS:
        edit = "unedited: the baseline" if row["strength"] == 0 else f"{strength}: {EDITS[mode]}"
        table.add_row(NOUNS[mode], edit)
    else:
        per_layer = ", ".join(f"layer {layer}: {value:.4g}" for layer, value in row["absolute_strength"].items())
        relative = ", ".join(f"layer {layer}: {value:.3g}x" for layer, value in row["relative_strength"].items())
        table.add_row("absolute", f"{per_layer} (the push added to the residual stream)")
        table.add_row("relative", f"{relative or '—'} (the push over the layer's activation norm)")
    table.add_row("effect", effect_words(row, trait))
    if row["strength"] != 0:
        table.add_row("noise", noise_words(row))
        table.add_row(
            "changed",
            f"{row.get('changed', 0)} of {len(row['outputs'])} texts differ from their "
            "unsteered text (an unchanged text's effect is exactly 0)",
        )
    distinct = "—" if row["distinct_2"] is None else f"{row['distinct_2']:.2f}"
    table.add_row(
        "degeneracy",
        f"distinct-2 {distinct}, longest run {row['longest_run']}, mean tokens "
        f"{row['mean_tokens']:.1f}: {'fluent' if row['fluent'] else 'not fluent'}",
    )
    if row.get("kl") is not None:
        table.add_row(
            "KL",
            f"{row['kl']:.3g} nats a token over each neutral prompt's unsteered continuation, "
            f"{row['kl_first']:.3g} at its first token (what steering costs the model)",
        )
    if row.get("fluency") is not None:
        table.add_row(
            "perplexity",
            f"{row['fluency']:.3g}× the baseline texts' (the unsteered model reading these texts against its own)",
        )
    if row.get("behaviour_shift") is not None:
        table.add_row(
            "behaviour",
            f"{row['behaviour_shift']:+.3g} nats toward {trait} on the held-out pairs "
            f"(log p(positive) − log p(negative)); positive side likelier on "
            f"{row['preferred']:.0%} of them",
        )
    return table


def effect_words(row: dict[str, Any], trait: str) -> str:
    """The effect, in residual-stream units and relative to the layers' norm, and what it measures."""
    if row["effect"] is None:
        return "— (every text is empty, so there is nothing to read back)"
    relative = row.get("relative_effect")
    over_norm = "" if relative is None else f" ({relative:+.3g} of the layers' activation norm)"
    return (
        f"{row['effect']:+.4g}{over_norm}: how far the text moved along the direction, read back by the "
        f"unsteered model, minus the baseline's, mean over the prompts, in residual-stream units; "
        f"+ toward {trait}, − away"
    )


def noise_words(row: dict[str, Any]) -> str:
    """The effect's noise, the band it must leave, and the verdict, in words."""
    if row.get("noise") is None:
        return (
            "none to judge by: one prompt leaves no spread of effects, so the effect cannot be told apart "
            "from chance and this strength is not suggested"
        )
    judged = verdict(row)
    said = {
        "toward": "beyond it: distinguishable from 0, on the side pushed",
        "against": "beyond it, but against the push: the text moved the other way, so it is not suggested",
        "": "within it: not distinguishable from 0, so this strength is not suggested",
    }[judged]
    return (
        f"{number(row['noise'], 3)} (the standard error of the effect over the prompts); the 95% band is "
        f"±{number(row['threshold'], 3)}, and the effect lies {said}"
    )


def output_effect(output: dict[str, Any]) -> str:
    """`` · effect +0.12`` after one output's length: its reading minus its own prompt's unsteered reading
    (exactly 0 when the text is the unsteered one)."""
    effect = output.get("effect")
    return "" if effect is None else f" · effect {number(effect, 3, sign=True) if effect else '0'}"
