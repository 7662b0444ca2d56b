"""The Jobs pane: every job this session started, newest first, its state and events; cancel from here.

A tune run's row leads its last message with the loss of its latest step (while it runs and once it
ended), and a cancelled run's row says where its checkpoint was kept, on a second line, the end of the
path shown when the path is longer than the column. Enter on a finished job's row opens its result
document whole (:mod:`ster.tui.screens.job_result`).

The table is redrawn from the job handles on every change, with fixed widths for the
short columns and the rest of the width for the last message, so a column never
keeps the width of the first thing it showed. When a job starts, the cursor moves to
it, so the highlighted row (and ``x``) follows the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, RichLog

from ster.tui.adapters import checkpoint_of
from ster.tui.paths import shown
from ster.tui.runner import JobHandle
from ster.tui.typed import InApp
from ster.tui.words import in_our_words

if TYPE_CHECKING:
    from ster.engine.protocol.events import Log, Outcome, Progress, Warning

    Shown = Progress | Warning | Log | Outcome
    """The events a job's row and log show (its tokens are the Generate tab's)."""

STATE_STYLE = {
    "queued": "dim",
    "running": "bold yellow",
    "done": "green",
    "refused": "red",
    "cancelled": "magenta",
    "failed": "bold red",
}
COLUMNS = (("#", 4), ("job", 16), ("state", 9), ("took", 7))
"""The short columns and their widths; the last message takes the rest."""
TUNE_RUNS = ("tune sft", "tune dpo", "tune reward", "tune grpo")
"""The jobs that train an adapter: their rows show the loss and a cancelled run's checkpoint."""


class JobTable(DataTable):
    """The jobs table; enter on a row says what it does in the key bar (a plain table's enter is unnamed)."""

    BINDINGS = [Binding("enter", "select_cursor", "Result", tooltip="Open the highlighted finished job's result")]


class JobsPane(InApp, Vertical):
    """The app feeds it every job message; it shows them and cancels on request."""

    DEFAULT_CSS = """
    JobsPane DataTable { height: auto; max-height: 50%; min-height: 4; }
    JobsPane RichLog { height: 1fr; border-top: solid $primary; scrollbar-gutter: stable; }
    """
    BINDINGS = [
        Binding("x", "cancel_job", "Cancel job", tooltip="Cancel the highlighted job (or the running one)"),
        Binding("enter", "show_result", "Result", tooltip="Open the highlighted finished job's result document whole"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handles: dict[int, JobHandle] = {}
        self.lines: list[Text] = []
        """Every event line so far: the log is written again from them when its width changes, since a
        line is wrapped once, at the width the log had when it was written (0 while the tab is hidden)."""

    def compose(self) -> ComposeResult:
        yield JobTable(cursor_type="row", zebra_stripes=True, id="job-table")
        yield RichLog(wrap=True, markup=False, min_width=20, id="events")

    def on_resize(self) -> None:
        self._redraw(self.highlighted())
        log = self.query_one(RichLog)
        log.clear()
        for line in self.lines:
            log.write(line)

    def record(self, handle: JobHandle, event: Shown | None = None) -> None:
        """Show a job's latest state and, when given, one of its events (a token changes neither)."""
        if event is not None and event.type == "token":
            return
        follow = handle.id not in self.handles or (handle.state == "running" and event is None)
        self.handles[handle.id] = handle
        self._redraw(handle.id if follow else self.highlighted())
        if event is not None:
            self.lines.append(Text(f"[{handle.id} {handle.name}] {_describe(event)}", style=_style(event)))
            self.query_one(RichLog).write(self.lines[-1])

    def _redraw(self, cursor: int | None) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        rest = max(12, self.size.width - sum(width + 2 for _, width in COLUMNS) - 4)
        for label, width in (*COLUMNS, ("last message", rest)):
            table.add_column(label, width=width, key=label)
        for handle in sorted(self.handles.values(), key=lambda h: -h.id):
            cells = _cells(handle, rest)
            table.add_row(*cells, key=str(handle.id), height=len(str(cells[-1]).splitlines()) or 1)
        if cursor is not None and str(cursor) in table.rows:
            table.move_cursor(row=table.get_row_index(str(cursor)), animate=False)

    def highlighted(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)

    def action_cancel_job(self) -> None:
        self.app.action_cancel_job(self.highlighted())

    def on_data_table_row_selected(self) -> None:
        """Enter (or a click on the highlighted row) opens the result, as the key bar's enter says."""
        self.action_show_result()

    def action_show_result(self) -> None:
        from ster.tui.screens.job_result import JobResultScreen

        handle = self.handles.get(self.highlighted() or 0)
        if handle is None:
            self.notify("no job yet: the other tabs start them")
        elif handle.result is not None:
            self.app.push_screen(JobResultScreen(f"#{handle.id} {handle.name} · result", handle.result))
        elif handle.active:
            self.notify(f"#{handle.id} {handle.name} is still {handle.state}; its result opens here once it ends")
        else:
            self.notify(f"#{handle.id} {handle.name} ended {handle.state}, without a result to show")


def _cells(handle: JobHandle, width: int) -> tuple[str | Text, ...]:
    took = handle.took
    return (
        str(handle.id),
        handle.name,
        Text(handle.state, style=STATE_STYLE[handle.state]),
        "" if took is None else f"{took:.1f} s",
        _message(handle, width),
    )


def _message(handle: JobHandle, width: int) -> str:
    """The last message cut to the column; a tune run's leads with its loss and names a kept checkpoint."""
    message = in_our_words(handle.last_message)
    if handle.name not in TUNE_RUNS:
        return _fit(message, width)
    if handle.loss is not None:  # the loss leads the cell, then the step (or the latest sentence after the steps)
        at = f"step {handle.trained[0]}/{handle.trained[1]}" if handle.trained else message
        message = f"loss {handle.loss:.4f} · {at}"
    checkpoint = _checkpoint(handle)
    if checkpoint is None:
        return _fit(message, width)
    stopped = handle.details if handle.details and "step" in handle.details else None  # where it stopped
    first = " · ".join(
        [
            *([f"loss {handle.loss:.4f}"] if handle.loss is not None else []),
            f"step {stopped['step']}/{stopped['total']}" if stopped else "cancelled",
        ]
    )
    where = shown(checkpoint)
    room = width - len("kept ")
    return _fit(first, width) + "\nkept " + (where if len(where) <= room else "…" + where[len(where) - room + 1 :])


def _checkpoint(handle: JobHandle) -> Path | None:
    """Where a cancelled tune run kept its checkpoint, ``<output>.checkpoint``; None when it kept none."""
    output = getattr(handle.request, "output", None) or handle.fields.get("output")
    kept = handle.details is not None and "checkpoint" in handle.details  # the run said it left one
    if handle.state != "cancelled" or output is None or not kept:
        return None
    return checkpoint_of(Path(output))


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _describe(event: Shown) -> str:
    if event.type == "result":
        return "finished"
    if event.type == "warning":
        return f"warning: {event.message}"
    if event.type == "error":
        return f"{event.kind}: {event.message}"
    return event.message


def _style(event: Shown) -> str:
    return {"warning": "yellow", "error": "red", "result": "green", "log": "dim"}.get(event.type, "")
