"""The help screen: every key, by where it works, read from the bindings themselves."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ster.tui.widgets.footer import KeyBar

INTRO = (
    "Ster steers a language model: write contrastive pairs (Pairs), fit and select a direction (Train), then "
    "compare steered with unsteered text, and with a LoRA adapter's, and sweep strengths (Generate); train a LoRA "
    "adapter on examples, pairs or prompts and watch its loss curve (Tune); load, inspect, evaluate, merge, export "
    "and use adapters (Adapters). Every action runs as an engine job; "
    "the Jobs tab shows their events and cancels them. The command palette (ctrl+p) lists every action too.\n\n"
    "Strength: 0.4x pushes along the direction by 0.4 times the layer's activation spread (the typical size of "
    "the residual stream's variation there), so the same number means about as much on any model; a bare number such as 3 "
    "is an absolute push in the residual stream's own units. Negative steers the other way. The Generate tab's mode "
    "says what the direction does: add steers along it; ablate removes its component at the embedding and every "
    "block, the strength then a weight (1 removes all of it); clamp sets that component to the strength. In a "
    "sweep, effect is how far the generated text itself moved along the direction, read back by the unsteered "
    "model, minus "
    "the unsteered text's: in the residual stream's units, positive toward the trait; ± is its noise band over "
    "the prompts (95%), ✓ an effect beyond it, ↺ beyond it against the push. Only ✓ is suggested, so sweep a "
    "prompt set (prompts: a file, or ster:prompts) to get a suggestion."
)


class HelpScreen(ModalScreen[None]):
    """Keys by section; any key closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen VerticalScroll { width: 90; max-width: 100%; height: 1fr; max-height: 40; margin: 1 0;
                                border: thick $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text(INTRO))
            for title, bindings in self.sections:
                table = Table(title=title, title_justify="left", title_style="bold", show_header=False, box=None)
                table.add_column(min_width=8, style="bold cyan", no_wrap=True)
                table.add_column(style="bold", no_wrap=True)
                table.add_column(style="dim")
                for binding in bindings:
                    table.add_row(
                        binding.key.replace("question_mark", "?").replace(",", ", "),
                        binding.description,
                        binding.tooltip if binding.tooltip != binding.description else "",
                    )
                yield Static(table)
            yield Static(Text("escape closes this screen", style="dim"))
        yield KeyBar(app_keys=False)
