"""Copying and saving what the Generate pane shows, from the keyboard.

What ``c`` copies and ``s`` saves follows the focus: the focused text panel's text, the
highlighted sweep row's outputs when the sweep table has focus and rows, and otherwise every
panel as one small document that says what produced each text (the prompt, the adapter, the
artifact, the strength), since a steered text without its settings is hard to use later.
"""

from __future__ import annotations

from pathlib import Path

from ster.tui.screens.save import save_text
from ster.tui.widgets.generate_jobs import GeneratePart
from ster.tui.widgets.generate_parts import TextPanel
from ster.tui.widgets.sweep_table import SweepTable, row_text


class GenerateText(GeneratePart):
    """Mixed into the Generate pane: what ``c`` copies and ``s`` saves."""

    def action_copy(self) -> None:
        what, text = self._chosen_text()
        if not text:
            self.say(f"nothing to copy yet: {what}", "yellow")
            return
        self.app.copy_to_clipboard(text)
        self.say(f"copied {what} ({len(text)} characters) to the clipboard", "green")

    def action_save(self) -> None:
        what, text = self._chosen_text()
        if not text:
            self.say(f"nothing to save yet: {what}", "yellow")
            return
        trait = (self.app.settings.artifact or {}).get("trait_name")
        save_text(self.app, text, Path(f"{trait or 'generated'}-text.txt"), self.say)

    def _chosen_text(self) -> tuple[str, str]:
        """(what it is, the text) for the focused part of the pane."""
        focused = self.app.focused
        table = self.query_one(SweepTable)
        key = table.highlighted_key() if focused is table else None
        if key is not None:
            row = table.rows_data.get(key)
            return f"the sweep's outputs at {table.strengths[key]}", row_text(row) if row else table.streamed(key)
        if isinstance(focused, TextPanel):
            return f"the {focused.title.split(' ·')[0]} text", focused.text
        shown = [role for role in ("baseline", "adapted", "steered") if self.panel(role).display]
        return f"the prompt and {'all three' if len(shown) == 3 else 'both'} texts", self._document()

    def _document(self) -> str:
        panels = [self.panel(role) for role in ("baseline", "adapted", "steered")]
        if not any(panel.text for panel in panels):
            return ""
        prompt = self.prompt_used
        parts = [f"prompt: {prompt}", f"[{panels[0].title}]\n{panels[0].text}"]
        parts += [f"[{panel.title}]\n{panel.text}" for panel in panels[1:] if panel.text]
        return "\n\n".join(parts) + "\n"
