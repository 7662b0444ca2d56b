"""How the CLI shows a job's events.

Stdout is data only: the result document, or in ``--json`` mode the NDJSON event
stream. Everything meant for a person goes to stderr — a live progress display when
stderr is a terminal, plain lines when it is a file or a pipe.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, TextIO

from ster.engine.protocol.events import Error, Event, Log, Progress, Result, Token, Warning
from ster.engine.protocol.files import dumps_pretty


class Renderer(Protocol):
    def __call__(self, event: Event) -> None: ...
    def close(self) -> None: ...


class JsonRenderer:
    """Every event as one JSON object per line on stdout, flushed as it happens."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: Event) -> None:
        self.out.write(event.to_json() + "\n")
        self.out.flush()

    def close(self) -> None:
        return None


class PlainRenderer:
    """Sentences on stderr, one per line; the result as pretty JSON on stdout."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err

    def __call__(self, event: Event) -> None:
        if isinstance(event, Result):
            self.out.write(dumps_pretty(event.data))
            self.out.flush()
        elif isinstance(event, Token):
            return
        else:
            self.err.write(_line(event) + "\n")
            self.err.flush()

    def close(self) -> None:
        return None


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
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, SpinnerColumn, TextColumn

        self.out = out
        self.console = Console(file=err, highlight=False)
        self.bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       console=self.console, transient=True)
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
    """The renderer for this process: NDJSON, a live terminal display, or plain lines."""
    out, err = out or sys.stdout, err or sys.stderr
    if json_mode:
        return JsonRenderer(out)
    if err.isatty():
        return TerminalRenderer(out, err)
    return PlainRenderer(out, err)
