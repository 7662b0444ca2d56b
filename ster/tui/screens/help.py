"""The help screen: every key, by where it works, read from the bindings themselves."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

INTRO = (
    "Ster steers a language model: write contrastive pairs (Pairs), fit and select a direction (Train), then "
    "compare steered with unsteered text and sweep strengths (Generate). Every action runs as an engine job; "
    "the Jobs tab shows their events and cancels them. The command palette (ctrl+p) lists every action too."
)


class HelpScreen(ModalScreen[None]):
    """Keys by section; any key closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen VerticalScroll { width: 90; height: 80%; border: thick $accent; background: $surface; padding: 1 2; }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text(INTRO))
            for title, bindings in self.sections:
                table = Table(title=title, title_justify="left", show_header=False, box=None, expand=True)
                table.add_column(width=14, style="bold")
                table.add_column()
                for binding in bindings:
                    table.add_row(binding.key.replace("question_mark", "?"), binding.description)
                yield Static(table)
            yield Static(Text("escape closes this screen", style="dim"))
