"""The Jobs pane: every job this session started, newest first, its state and events; cancel from here.

The table is redrawn from the job handles on every change, with fixed widths for the
short columns and the rest of the width for the last message, so a column never
keeps the width of the first thing it showed. When a job starts, the cursor moves to
it, so the highlighted row (and ``x``) follows the work.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, RichLog

from ster.engine.protocol.events import Event
from ster.tui.runner import JobHandle
from ster.tui.words import in_our_words

STATE_STYLE = {"queued": "dim", "running": "bold yellow", "done": "green", "refused": "red", "cancelled": "magenta",
               "failed": "bold red"}
COLUMNS = (("#", 4), ("job", 16), ("state", 9), ("took", 7))
"""The short columns and their widths; the last message takes the rest."""


class JobsPane(Vertical):
    """The app feeds it every job message; it shows them and cancels on request."""

    DEFAULT_CSS = """
    JobsPane DataTable { height: auto; max-height: 50%; min-height: 4; }
    JobsPane RichLog { height: 1fr; border-top: solid $primary; scrollbar-gutter: stable; }
    """
    BINDINGS = [Binding("x", "cancel_job", "Cancel job", tooltip="Cancel the highlighted job (or the running one)")]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handles: dict[int, JobHandle] = {}
        self.lines: list[Text] = []
        """Every event line so far: the log is written again from them when its width changes, since a
        line is wrapped once, at the width the log had when it was written (0 while the tab is hidden)."""

    def compose(self) -> ComposeResult:
        yield DataTable(cursor_type="row", zebra_stripes=True, id="job-table")
        yield RichLog(wrap=True, markup=False, min_width=20, id="events")

    def on_resize(self) -> None:
        self._redraw(self.highlighted())
        log = self.query_one(RichLog)
        log.clear()
        for line in self.lines:
            log.write(line)

    def record(self, handle: JobHandle, event: Event | None = None) -> None:
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
            table.add_row(*_cells(handle, rest), key=str(handle.id))
        if cursor is not None and str(cursor) in table.rows:
            table.move_cursor(row=table.get_row_index(str(cursor)), animate=False)

    def highlighted(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)

    def action_cancel_job(self) -> None:
        self.app.action_cancel_job(self.highlighted())  # type: ignore[attr-defined]


def _cells(handle: JobHandle, width: int) -> tuple[str | Text, ...]:
    took = handle.took
    message = in_our_words(handle.last_message)
    return (str(handle.id), handle.name, Text(handle.state, style=STATE_STYLE[handle.state]),
            "" if took is None else f"{took:.1f} s",
            message if len(message) <= width else message[: width - 1] + "…")


def _describe(event: Event) -> str:
    if event.type == "result":
        return "finished"
    if event.type == "warning":
        return f"warning: {event.message}"
    if event.type == "error":
        return f"{event.kind}: {event.message}"
    return event.message  # type: ignore[union-attr]


def _style(event: Event) -> str:
    return {"warning": "yellow", "error": "red", "result": "green", "log": "dim"}.get(event.type, "")
