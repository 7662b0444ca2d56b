"""The key bar: the keys of what has focus on the left, the keys that work everywhere pinned on the right.

Textual's footer lists every active key in one row and cuts the row at the screen's
edge, so on a tab with many keys the ones a person needs most (help, the model, cancel,
quit) fell off at 120 columns. Here those are pinned to the right edge and the tab's own
keys fill what is left. Every screen, modal dialogs included, has its own bar, so a
dialog shows its keys rather than those of the tab under it.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.widgets import Footer

PINNED = ("help", "model", "cancel_job", "quit")
"""The actions that work on every tab, in the order they are pinned."""


class KeyBar(Footer):
    """A compact footer with the app-wide keys pinned right (or, in a dialog, left out); ctrl+p is in the
    help, not the bar."""

    DEFAULT_CSS = """
    KeyBar #pinned { dock: right; width: auto; height: 1; background: $footer-background; padding-left: 1; }
    """

    def __init__(self, app_keys: bool = True, **kwargs: Any) -> None:
        super().__init__(compact=True, show_command_palette=False, **kwargs)
        self.app_keys = app_keys

    def compose(self) -> ComposeResult:
        pinned = {}
        for widget in super().compose():
            action = getattr(widget, "action", None)
            if action in PINNED:
                pinned[action] = widget
            else:
                yield widget
        if pinned and self.app_keys:
            with HorizontalGroup(id="pinned"):
                yield from (pinned[action] for action in PINNED if action in pinned)
