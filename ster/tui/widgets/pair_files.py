"""The Pairs pane's file actions: open, save, save as, import into the workspace, and synthesize.

Each asks what it needs in a dialog, asks again before it would drop unsaved edits or
replace an existing file, and then runs the engine's job; the pane renders the job's
end (:mod:`ster.tui.widgets.pairs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ster.tui.typed import InApp

if TYPE_CHECKING:
    from ster.engine.pairs.model import Pair, PairSet
    from ster.tui.runner import JobHandle


class PairFiles(InApp):
    """Mixed into the Pairs pane, which provides what it declares below."""

    if TYPE_CHECKING:
        path: Path | None
        dirty: bool
        live: list[Pair] | None
        stage: str
        _opened_note: str
        _inspection: JobHandle | None

        @property
        def pair_set(self) -> PairSet: ...
        def _busy(self) -> bool: ...
        def _start(self, job: str, **fields: Any) -> JobHandle | None: ...
        def _say(self, text: str, style: str) -> None: ...
        def _redraw(self, cursor: int | None = None) -> None: ...

    # --- files: open, save, save as, import ----------------------------------------------------------

    def action_open(self) -> None:
        self._unless_unsaved("open another file", lambda: self._ask_path("Pair set to open", self._open_answer))

    def _open_answer(self, answer: str | None) -> None:
        from ster.engine.protocol.paths import example_path

        if not answer:
            return
        try:
            self._open(example_path(answer.strip()).expanduser())  # a bundled name such as ster:pairs, or a path
        except ValueError as exc:
            self._say(str(exc), "red")

    def _open(self, path: Path, note: str = "") -> None:
        self._opened_note = note
        self._inspection = self._start("pairs inspect", pairs=path)
        self._say(f"opening {path}…", "dim")

    def action_save(self) -> None:
        if self.path is None:
            self.action_save_as()
        elif not self._busy():
            self._save_to(self.path)

    def action_save_as(self) -> None:
        if not self._busy():
            self._ask_path("Save the pair set as", self._save_as_answer)

    def _save_as_answer(self, answer: str | None) -> None:
        from ster.tui.screens.dialogs import Confirm

        if not answer:
            return
        path = Path(answer).expanduser()
        if path == self.path or not path.is_file():
            self._save_to(path)
            return
        self.app.push_screen(
            Confirm(f"{path} exists. Replace it with this set?", "Replace", "Keep it"),
            lambda yes: self._save_to(path) if yes else None,
        )

    def _save_to(self, path: Path) -> None:
        self._start("pairs save", pairs=path, pair_set=self.pair_set)

    def action_import(self) -> None:
        from ster.tui.screens.dialogs import AskText

        if self.path is None or self.dirty:
            why = "has no file yet" if self.path is None else "has unsaved changes"
            self._say(f"import copies the saved file, and this set {why}: save it first (s)", "red")
            return
        self.app.push_screen(
            AskText(
                "Keep it in the workspace under the id", self.path.stem, "lowercase letters, digits, '.', '_' and '-'"
            ),
            self._import_answer,
        )

    def _import_answer(self, name: str | None) -> None:
        if name and self.path is not None:
            self._start("workspace import-pairs", source=self.path, name=name)

    def _ask_path(self, question: str, then: Any) -> None:
        from ster.tui.screens.dialogs import AskText

        self.app.push_screen(AskText(question, str(self.path or "pairs.json"), "a .json file"), then)

    def _unless_unsaved(self, doing: str, proceed: Any) -> None:
        """Ask before a step that replaces an edited set; go straight on when it is saved."""
        from ster.tui.screens.dialogs import Confirm

        if self._busy():
            return
        if not self.dirty:
            proceed()
            return
        self.app.push_screen(
            Confirm(f"This set has unsaved changes. Drop them and {doing}?", "Drop them", "Keep editing"),
            lambda yes: yes and proceed(),
        )

    # --- synthesis: kept pairs appear as they arrive; the written file is opened at the end ----------

    def action_synthesize(self) -> None:
        from ster.tui.screens.synthesize import SynthesizeDialog

        settings = self.app.settings
        output = str((self.path.parent if self.path else Path()) / "synthesized.json")
        self._unless_unsaved(
            "synthesize a new set",
            lambda: self.app.push_screen(SynthesizeDialog(settings.model, output), self._synthesize_answer),
        )

    def _synthesize_answer(self, form: dict[str, str] | None) -> None:
        from ster.tui.screens.dialogs import replace_or_keep

        if not form:
            return
        replace_or_keep(
            self.app,
            Path(form["output"]).expanduser(),
            "pair set",
            "the synthesized set",
            lambda: self._synthesize(form),
            self._say,
        )

    def _synthesize(self, form: dict[str, str]) -> None:
        fields: dict[str, Any] = {
            "trait": form["trait"],
            "count": form["count"],
            "generator": form["generator"],
            "output": Path(form["output"]).expanduser(),
            "generator_model": form["generator_model"] or None,
        }
        if form["generator"] == "local":
            fields.update(self.app.settings.model_fields())
        if self._start("pairs synthesize", **fields) is not None:
            self.live, self.stage = [], ""
            self._redraw()
