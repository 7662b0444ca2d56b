"""Saving a text the app shows (generated text, a sweep row) to a file the person names.

The person is asked for a path (a suggestion is filled in), then asked again before an
existing file is replaced; the text is written through the engine's atomic write, so an
interrupted save leaves the old file or none, never half of one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual.app import App

from ster.tui.paths import shown

Said = Callable[[str, str], None]
"""Where the outcome goes: ``say(sentence, style)``, the pane's message line."""


def save_text(app: App, text: str, suggested: Path, say: Said) -> None:
    """Ask where, ask before replacing, write atomically, and say what happened."""
    from ster.tui.screens.dialogs import AskText

    def chosen(answer: str | None) -> None:
        if not answer:
            return
        path = Path(answer).expanduser()
        if path.is_dir():
            say(f"{shown(path)} is a directory: give a file name", "red")
        elif path.exists():
            from ster.tui.screens.dialogs import Confirm

            app.push_screen(
                Confirm(f"{shown(path)} exists. Replace it with this text?", "Replace", "Keep it"),
                lambda yes: write(path) if yes else say(f"kept {shown(path)}; nothing saved", "yellow"),
            )
        else:
            write(path)

    def write(path: Path) -> None:
        from ster.engine.protocol.files import write_atomic

        try:
            write_atomic(path, text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            say(f"could not save to {shown(path)}: {exc.strerror or exc}", "red")
            return
        say(f"saved {len(text)} characters to {shown(path)}", "green")

    app.push_screen(AskText("Save the text to", str(suggested.absolute()), "a file path"), chosen)
