"""A text block whose height follows its wrapped text, also on the first paint.

A ``height: auto`` Static updated while the app is still laying out its first screen can
keep the height of its previous text (one line short when the new text wraps), so every
update also asks for a layout pass once the refresh is done.
"""

from __future__ import annotations

from typing import Any

from textual.widgets import Static


class Wrapped(Static):
    """A Static that lays itself out again after each update."""

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout)
        self.call_after_refresh(self.refresh, layout=True)
