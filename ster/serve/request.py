"""``ster request OPERATION``: one job from a JSON body on stdin, its lines as ``ster serve`` streams them.

The body and the lines are :mod:`ster.serve.wire`'s, so a body means the same here as over HTTP.
Exit status is the last line's status:

* 0: done, and the last line's ``json`` is the command's document;
* 1: failed while running; the line before the last is ``error: <sentence>``;
* 2: refused before running, with no log line: an unknown operation, a body that is not JSON
  (or over 1 MiB), a missing field or a bad value.

Ctrl-C cancels the job as for any command (the last line then says status 1) and exits 130.
If stdout is closed, the process removes the temporaries of writes in flight and exits 1 at the
next line it cannot write.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, BinaryIO

from ster.engine.protocol.errors import ExitCode
from ster.engine.protocol.events import Error, Event
from ster.foreground import Foreground
from ster.serve import wire

REFUSED = 2


def _read_stdin(stream: BinaryIO) -> bytes:
    try:
        return stream.read(wire.BODY_LIMIT + 1)
    except OSError:
        raise wire.WireRefusal("failed to read the request body from stdin") from None


class WireRenderer:
    """Writes the default stream's lines for each event to stdout (the Foreground's renderer)."""

    def __init__(self, job: str, out: BinaryIO) -> None:
        self.job, self.out = job, out
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self.lock:
            self._write(event)

    def _write(self, event: Event) -> None:
        try:
            for chunk in wire.default_lines(self.job, event):
                self.out.write(chunk)
            self.out.flush()
        except (OSError, ValueError):  # stdout is closed: nobody reads the result, so stop here
            from ster.engine.protocol import inflight

            inflight.remove_all(hold=True)
            os._exit(1)

    def say(self, line: str) -> None:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def abort(self, event: Error) -> None:
        if self.lock.acquire(timeout=1.0):
            self._write(event)

    def close(self) -> None:
        return None


def run_request(operation: str, foreground: Foreground, stdin: Any = None, stdout: Any = None) -> int:
    """Read the body, run the operation, and return the exit status."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    try:
        job = wire.job_for(operation)
        body = wire.parse_body(_read_stdin(stdin))
        prepared = wire.prepare(operation, body)
    except (wire.WireRefusal, UnicodeDecodeError) as exc:
        sentence = str(exc) if isinstance(exc, wire.WireRefusal) else f"{wire.NOT_JSON}: {exc}"
        stdout.write(wire.result_line({"error": sentence}, REFUSED))
        stdout.flush()
        return REFUSED
    render = WireRenderer(job, stdout)
    final = foreground.run(job, prepared.request, render)
    if wire.final_status(job, final) == 0:
        return int(ExitCode.OK)
    return int(ExitCode.CANCELLED) if foreground.cancel.is_set() else 1
