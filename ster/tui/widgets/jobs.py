"""The Jobs pane: every job this session started, its state, its events; cancel from here."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, RichLog

from ster.engine.protocol.events import Event
from ster.tui.runner import JobHandle

STATE_STYLE = {"queued": "dim", "running": "bold yellow", "done": "green", "refused": "red", "cancelled": "magenta",
               "failed": "bold red"}


class JobsPane(Vertical):
    """The app feeds it every job message; it shows them and cancels on request."""

    DEFAULT_CSS = """
    JobsPane DataTable { height: 1fr; min-height: 5; }
    JobsPane RichLog { height: 2fr; border-top: solid $primary; }
    """
    BINDINGS = [Binding("x", "cancel_job", "Cancel job", tooltip="Cancel the highlighted job (or the running one)")]

    def compose(self) -> ComposeResult:
        table = DataTable(cursor_type="row", zebra_stripes=True, id="job-table")
        table.add_columns("#", "job", "state", "last message")
        yield table
        yield RichLog(wrap=True, markup=False, id="events")

    def record(self, handle: JobHandle, event: Event | None = None) -> None:
        """Show a job's latest state and, when given, one of its events."""
        table = self.query_one(DataTable)
        cells = (str(handle.id), handle.name, Text(handle.state, style=STATE_STYLE[handle.state]),
                 handle.last_message[:80])
        key = str(handle.id)
        if key in table.rows:
            for column, value in zip(table.columns, cells):
                table.update_cell(key, column, value)
        else:
            table.add_row(*cells, key=key)
        if event is not None and event.type != "token":
            self.query_one(RichLog).write(Text(f"[{handle.id} {handle.name}] {_describe(event)}",
                                               style=_style(event)))

    def highlighted(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)

    def action_cancel_job(self) -> None:
        self.app.action_cancel_job(self.highlighted())  # type: ignore[attr-defined]


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
