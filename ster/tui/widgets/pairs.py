"""The Pairs pane: write, inspect, save, import and synthesize a pair set.

The pane holds the set being edited in memory and renders what the engine says about
it: after every change it runs ``pairs inspect`` on the in-memory set and shows that
report's duplicate, refusal and balance flags, so the flags here are always the CLI's.
Opening a file is the same job given a path; saving is ``pairs save``, which validates
the whole set and writes it atomically. A set is never mutated in place: each change
builds a new :class:`PairSet`, so a request already handed to a worker never changes
under it, and "is this what was saved?" is a plain equality.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from ster.tui.messages import JobEvent, JobFinished
from ster.tui.runner import JobHandle
from ster.tui.widgets.pair_files import PairFiles
from ster.tui.widgets.pair_report import detail_text, distinct_parts, flag_cells, summary_text
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import in_our_words, said

FIXED_COLUMNS = (("#", 4), ("duplicate", 20), ("refusal", 22), ("ratio", 6))
NARROW_COLUMNS = (("#", 3), ("duplicate", 12), ("refusal", 14), ("ratio", 5))
"""Below 110 columns the flag columns give their width to the two texts (a cut flag still names its kind)."""
NEW_SET = "trait"

if TYPE_CHECKING:
    from ster.engine.pairs.model import Pair, PairSet


def _models() -> Any:
    """The pair-set models, imported when the pane first holds a set: after the first paint, which the
    validation library they are built on would otherwise delay by about a tenth of a second."""
    from ster.engine.pairs import model

    return model


class PairsPane(PairFiles, Vertical):
    """One pair set in memory, its inspect report as a table, and the jobs that read and write it."""

    DEFAULT_CSS = """
    PairsPane #summary { height: auto; padding: 0 1; border: round $primary; border-title-color: $text; }
    PairsPane #message { height: auto; padding: 0 1; }
    PairsPane DataTable { height: 1fr; }
    PairsPane #detail { height: auto; max-height: 12; padding: 0 1; border: round $panel; }
    """
    BINDINGS = [
        Binding("a", "add", "Add", tooltip="Write a new pair"),
        Binding("e,enter", "edit", "Edit", tooltip="Rewrite the highlighted pair"),
        Binding("d", "delete", "Delete", tooltip="Drop the highlighted pair"),
        Binding("o", "open", "Open", tooltip="Open a pair-set file"),
        Binding("s", "save", "Save", tooltip="Save to the set's file (asks for one the first time)"),
        Binding("w", "save_as", "Save as", tooltip="Save to a new file and keep working on it"),
        Binding("n", "rename", "Rename trait", tooltip="Change the set's trait name"),
        Binding("i", "import", "Import", tooltip="Keep a copy in the workspace and make it the active set"),
        Binding("y", "synthesize", "Synthesize", tooltip="Have a model write a set from a trait description"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pair_set: PairSet | None = None
        self.path: Path | None = None
        """The file the set belongs to; None until it is saved or opened."""
        self.dirty = False
        self.report: dict[str, Any] | None = None
        """The inspect report of ``pair_set`` as it is now; None while the one for the latest change runs."""
        self.live: list[Pair] | None = None
        """The pairs a running synthesis has kept so far, shown instead of the set until it ends."""
        self.stage = ""
        """The running synthesis's latest step, shown in the summary so the message line keeps its warnings."""
        self._inspection: JobHandle | None = None
        """The latest inspect job: only its report describes the current set; earlier ones are stale."""
        self._opened_note = ""

    @property
    def pair_set(self) -> PairSet:
        """The set being edited; a new, empty one until a file is opened or a pair added."""
        if self._pair_set is None:
            self._pair_set = _models().PairSet(trait_name=NEW_SET, pairs=[])
        return self._pair_set

    @pair_set.setter
    def pair_set(self, value: PairSet) -> None:
        self._pair_set = value

    def compose(self) -> ComposeResult:
        yield Wrapped("", id="summary")
        yield Wrapped("", id="message")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="pairs-table")
        yield Wrapped("", id="detail")

    def on_mount(self) -> None:
        self.call_after_refresh(self._begin)  # the app's frame is painted first; the set follows at once

    def _begin(self) -> None:
        path: Path | None = self.app.settings.pairs
        remote = getattr(self.app, "remote", None) is not None
        if path is not None and (remote or path.exists()):  # on a server, the server says whether it exists
            self._open(path)
            return
        self.path = path  # an empty set has nothing to inspect, so no job runs until the first change
        self._redraw()
        if path is None:
            server = "; until one is saved, Train uses the server's active set" if remote else ""
            self._say(
                f'a new, empty set named "{NEW_SET}": a adds a pair, n renames it, o opens a file, '
                f"y synthesizes one{server}",
                "",
            )
        else:
            self._say(
                f'{path} does not exist yet: add pairs (a), name the trait (n, now "{NEW_SET}"), then s saves '
                "them there",
                "yellow",
            )

    def on_resize(self) -> None:
        """The text columns share whatever width the fixed ones leave."""
        if self._pair_set is not None or self.live is not None:  # else the table is filled once the set is there
            self._fill_table(self._highlighted())

    # --- editing: each change replaces the set, then asks the engine about it -------------------------

    def action_add(self) -> None:
        from ster.tui.screens.pair_editor import PairEditor

        if self._busy():
            return
        self.app.push_screen(PairEditor("Add a pair"), self._added)

    def _added(self, texts: tuple[str, str] | None) -> None:
        if texts:
            pairs = [*self.pair_set.pairs, _models().Pair(positive=texts[0], negative=texts[1])]
            self._change(self.pair_set.model_copy(update={"pairs": pairs}), cursor=len(pairs) - 1)

    def action_edit(self) -> None:
        from ster.tui.screens.pair_editor import PairEditor

        index = None if self._busy() else self._highlighted()
        if index is None:
            return
        pair = self.pair_set.pairs[index]
        self.app.push_screen(
            PairEditor(f"Edit pair {index}", pair.positive, pair.negative), lambda texts: self._edited(index, texts)
        )

    def _edited(self, index: int, texts: tuple[str, str] | None) -> None:
        if texts and texts != (self.pair_set.pairs[index].positive, self.pair_set.pairs[index].negative):
            pairs = list(self.pair_set.pairs)
            pairs[index] = _models().Pair(positive=texts[0], negative=texts[1])
            self._change(self.pair_set.model_copy(update={"pairs": pairs}), cursor=index)

    def on_data_table_row_highlighted(self) -> None:
        self._show_detail()

    def on_data_table_row_selected(self) -> None:
        """Enter (or a click on the highlighted row) edits, as the footer's e does."""
        self.action_edit()

    def action_delete(self) -> None:
        index = None if self._busy() else self._highlighted()
        if index is None:
            return
        pairs = [pair for i, pair in enumerate(self.pair_set.pairs) if i != index]
        self._change(self.pair_set.model_copy(update={"pairs": pairs}), cursor=index)
        self._say(f"deleted pair {index}", "")

    def action_rename(self) -> None:
        from ster.tui.screens.dialogs import AskText

        if not self._busy():
            self.app.push_screen(AskText("Trait name of this set", self.pair_set.trait_name), self._renamed)

    def _renamed(self, name: str | None) -> None:
        if name and name != self.pair_set.trait_name:
            self._change(self.pair_set.model_copy(update={"trait_name": name}), cursor=self._highlighted())

    def _change(self, pair_set: PairSet, cursor: int | None) -> None:
        """Take the changed set, show it at once, and inspect it (its flags arrive with the report)."""
        self.pair_set, self.dirty, self.report = pair_set, True, None
        self._redraw(cursor)
        self._inspection = self._start("pairs inspect", pair_set=pair_set)

    def _busy(self) -> bool:
        """A running synthesis replaces the set when it ends, so edits wait for it."""
        if self.live is not None:
            self._say("a synthesis is running: wait for it, or cancel it with ctrl+x", "yellow")
        return self.live is not None

    def _highlighted(self) -> int | None:
        table = self.query_one(DataTable)
        return table.cursor_row if self.live is None and self.pair_set.pairs and table.row_count else None

    # --- rendering the jobs' events ------------------------------------------------------------------

    def _start(self, job: str, **fields: Any) -> JobHandle | None:
        self._say("", "")
        return self.app.start_job(job, fields, self)

    def on_job_event(self, message: JobEvent) -> None:
        event = message.event
        if event.type == "warning":
            self._say(f"warning: {in_our_words(event.message)}", "yellow")
        elif event.type == "progress" and message.handle.name == "pairs synthesize":
            self._synthesis_progress(event)

    def _synthesis_progress(self, event: Any) -> None:
        if event.stage == "kept" and event.data and self.live is not None:
            self.live.append(_models().Pair.model_validate(event.data))
            self._add_row(len(self.live) - 1, self.live[-1], None)
            self.query_one(DataTable).move_cursor(row=len(self.live) - 1)
        self.stage = event.message
        self._show_summary()

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        if handle.name == "pairs inspect" and handle.id and handle is not self._inspection:
            return  # a report on a set that has changed since
        if handle.name == "pairs synthesize":
            self.live = None
        if final.type == "error":
            if handle is self._inspection:
                self._inspection = None  # the summary then says the flags are unknown
            self._redraw(self._highlighted())
            self._say(said(final), "red")
            return
        request, data = handle.request, final.data
        {
            "pairs inspect": self._inspected,
            "pairs save": self._saved,
            "workspace import-pairs": self._imported,
            "pairs synthesize": self._synthesized,
        }[handle.name](request, data)

    def _inspected(self, request: Any, data: dict[str, Any]) -> None:
        if request.pair_set is None:  # an open: the report carries the whole set
            models = _models()
            pairs = [models.Pair(positive=p["positive"], negative=p["negative"]) for p in data["pairs"]]
            self.pair_set = models.PairSet(trait_name=data["trait_name"], pairs=pairs)
            self.dirty = False
            self._use_path(request.pairs)
            self._say(self._opened_note or f"opened {request.pairs}", "green")
        self.report = data
        self._redraw(self._highlighted())

    def _saved(self, request: Any, data: dict[str, Any]) -> None:
        if request.pair_set == self.pair_set:  # not if the set changed while the save ran
            self.dirty = False
        self._use_path(request.pairs)
        self._redraw(self._highlighted())
        created = " (a new file)" if data["created"] else ""
        self._say(f"saved {data['pair_count']} pairs to {request.pairs}{created}", "green")

    def _imported(self, request: Any, data: dict[str, Any]) -> None:
        self._say(data["reason"], "green")  # the engine's sentence names the id and says it is active

    def _synthesized(self, request: Any, data: dict[str, Any]) -> None:
        rejected = data["rejected_empty"] + data["rejected_refusals"] + data["rejected_duplicates"]
        self._open(
            request.output,
            f"synthesized {data['kept']} of {data['requested']} pairs with "
            f"{data['generator']} in {data['attempts']} attempts ({rejected} rejected); "
            f"opened {request.output}",
        )

    def _use_path(self, path: Path) -> None:
        """The set now belongs to this file, and the other tabs train and evaluate on it."""
        self.path = path
        settings = self.app.settings
        settings.pairs, settings.trait = path, self.pair_set.trait_name
        self.app.settings_changed("pairs")

    def _redraw(self, cursor: int | None = None) -> None:
        self._show_summary()
        self._fill_table(cursor)

    def _show_summary(self) -> None:
        summary = self.query_one("#summary", Static)
        place = str(self.path) if self.path else "unsaved: no file yet"
        dirty = " · modified (s saves; Train reads the saved file)" if self.dirty else ""
        summary.border_title = Text.assemble(f"{self.pair_set.trait_name} · {place}", (dirty, "bold yellow"))
        if self.live is not None:
            summary.update(
                Text(
                    f"{self.stage or 'synthesizing'}: {len(self.live)} kept so far "
                    "(ctrl+x cancels; the written set is opened when it ends)"
                )
            )
        else:
            summary.update(summary_text(self.pair_set, self.report, self._inspection is not None))

    def _fill_table(self, cursor: int | None = None) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        fixed = NARROW_COLUMNS if self.size.width < 110 else FIXED_COLUMNS
        text_width = max(10, (self.size.width - sum(w + 2 for _, w in fixed) - 6) // 2)
        for label, width in (fixed[0], ("positive", text_width), ("negative", text_width), *fixed[1:]):
            table.add_column(label, width=width, key=label)
        reported = (self.report or {}).get("pairs") if self.live is None else None
        for index, pair in enumerate(self.live if self.live is not None else self.pair_set.pairs):
            self._add_row(index, pair, reported[index] if reported else None)
        if cursor is not None and table.row_count:
            table.move_cursor(row=min(cursor, table.row_count - 1))
        self._show_detail()

    def _show_detail(self) -> None:
        """The highlighted pair in full, since the table cuts both sides where they often differ: the end."""
        detail, table = self.query_one("#detail", Static), self.query_one(DataTable)
        pairs = self.live if self.live is not None else self.pair_set.pairs
        index = table.cursor_row if table.row_count and table.cursor_row < len(pairs) else None
        detail.display = index is not None
        if index is not None:
            reported = (self.report or {}).get("pairs") if self.live is None else None
            detail.border_title = f"pair {index}"
            detail.update(detail_text(pairs[index], reported[index] if reported else None))

    def _add_row(self, index: int, pair: Pair, row: dict[str, Any] | None) -> None:
        table = self.query_one(DataTable)
        width = table.columns[ColumnKey("positive")].width
        positive, negative = distinct_parts(pair.positive, pair.negative, width)
        table.add_row(str(index), Text(positive), Text(negative), *(flag_cells(row) if row else ("", "", "")))

    def _say(self, text: str, style: str) -> None:
        self.query_one("#message", Static).update(Text(text, style=style))
