"""How the CLI shows a job's events.

Stdout is data only: the result document, or in ``--json`` mode the NDJSON event
stream. Everything meant for a person goes to stderr — a live progress display when
stderr is a terminal, plain lines when it is a file or a pipe. Under ``torchrun`` only
rank 0 shows the job; every other rank says nothing but its own failure, one line on
stderr naming the rank, so that N processes print one report.

Events arrive on the job's worker thread; :meth:`Renderer.say` and :meth:`Renderer.abort`
are called from the main thread's Ctrl-C handler. Each renderer serialises its writes with
a lock, and ``abort`` waits for it at most a second, because the process exits right after.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, Any, Protocol, TextIO

from ster.engine.protocol.events import Error, Event, Log, Progress, Result, Token, Warning
from ster.engine.protocol.files import dumps_pretty


class Renderer(Protocol):
    def __call__(self, event: Event) -> None: ...

    def say(self, line: str) -> None:
        """One line for the person at the terminal, on stderr, outside the event stream."""

    def abort(self, event: Error) -> None:
        """Show the last event of a process that exits at once, without waiting on a stuck writer."""

    def close(self) -> None: ...


class _Serialised:
    """Writes from the worker and from the Ctrl-C handler, one at a time."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self.lock:
            self._show(event)

    def say(self, line: str) -> None:
        locked = self.lock.acquire(timeout=1.0)  # a worker stuck on a full pipe must not swallow the line
        try:
            _write(self.err, line + "\n")
        finally:
            if locked:
                self.lock.release()

    def abort(self, event: Error) -> None:
        if self.lock.acquire(timeout=1.0):
            self._show(event)

    def close(self) -> None:
        return None

    def _show(self, event: Event) -> None:
        raise NotImplementedError


def _write(stream: IO[str], text: str) -> None:
    stream.write(text)
    stream.flush()


class JsonRenderer(_Serialised):
    """Every event as one JSON object per line on stdout, flushed as it happens."""

    def _show(self, event: Event) -> None:
        _write(self.out, event.to_json() + "\n")


class PlainRenderer(_Serialised):
    """Sentences on stderr, one per line; the result as pretty JSON on stdout."""

    def _show(self, event: Event) -> None:
        if isinstance(event, Result):
            _write(self.out, dumps_pretty(event.data))
        elif not isinstance(event, Token):
            _write(self.err, _line(event) + "\n")


class RankRenderer(_Serialised):
    """A ``torchrun`` rank other than 0: silent but for a failure of its own (rank 0 reports the rest)."""

    def __init__(self, out: TextIO, err: TextIO, rank: int) -> None:
        super().__init__(out, err)
        self.rank = rank

    def say(self, line: str) -> None:
        return None

    def _show(self, event: Event) -> None:
        if isinstance(event, Error) and event.kind != "cancelled":
            _write(self.err, f"rank {self.rank}: {_line(event)}\n")


def torchrun_rank() -> int:
    """This process's rank when ``torchrun`` started it among others, else 0."""
    try:
        return int(os.environ["RANK"]) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    except (KeyError, ValueError):
        return 0


def _line(event: Event) -> str:
    if isinstance(event, Warning):
        return f"warning: {event.message}"
    if isinstance(event, Error):
        return event.message if event.kind == "cancelled" else f"error: {event.message}"
    assert isinstance(event, Progress | Log)
    return event.message


class TerminalRenderer:
    """A live progress bar for countable stages, sentences above it, generated text streamed."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn
        from rich.progress import Progress as Bar

        self.out = out
        self.console = Console(file=err, highlight=False)
        self.bar = Bar(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
        )
        self.tasks: dict[str, Any] = {}
        self.streaming = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, Token):
            self._stream(event.text)
            return
        self._end_stream()
        if isinstance(event, Result):
            self.close()
            self.out.write(dumps_pretty(event.data))
            self.out.flush()
        elif isinstance(event, Progress) and event.total:
            self._advance(event)
        else:
            style = {"warning": "yellow", "error": "red"}.get(event.type, "dim")
            self.console.print(_line(event), style=style, markup=False)

    def say(self, line: str) -> None:
        self._end_stream()
        self.console.print(line, style="yellow", markup=False)

    def abort(self, event: Error) -> None:
        """Written straight to the file, bypassing rich's lock; shows the cursor the live bar hid."""
        _write(self.console.file, "\x1b[?25h\n" + _line(event) + "\n")

    def _advance(self, event: Progress) -> None:
        if not self.tasks:
            self.bar.start()
        if event.stage not in self.tasks:
            self.tasks[event.stage] = self.bar.add_task(event.message, total=event.total)
        self.bar.update(self.tasks[event.stage], completed=event.current or 0, description=event.message)

    def _stream(self, text: str) -> None:
        if not self.streaming:
            self.close()
            self.streaming = True
        self.console.file.write(text)
        self.console.file.flush()

    def _end_stream(self) -> None:
        if self.streaming:
            self.console.file.write("\n")
            self.streaming = False

    def close(self) -> None:
        if self.tasks:
            self.bar.stop()
            self.tasks.clear()


def renderer_for(json_mode: bool, out: TextIO | None = None, err: TextIO | None = None) -> Renderer:
    """The renderer for this process: NDJSON, a live terminal display, plain lines, or a rank's silence."""
    out, err = out or sys.stdout, err or sys.stderr
    if torchrun_rank():
        return RankRenderer(out, err, torchrun_rank())
    if json_mode:
        return JsonRenderer(out, err)
    if err.isatty():
        return TerminalRenderer(out, err)
    return PlainRenderer(out, err)
