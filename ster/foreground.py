"""One job in the foreground of a terminal, where Ctrl-C means "stop, and write nothing".

The job runs on a worker thread, and the main thread waits on an :class:`threading.Event`
the worker sets when the job has emitted its final event. For as long as the job runs,
SIGINT is handled here and never raises in the main thread:

* the first Ctrl-C sets the job's cancel flag and says so in one line; the job stops at
  its next check, between units of work, and ends with the ``cancelled`` error event
  (exit 130), its atomic writes never committed;
* a second Ctrl-C does not wait for a job busy inside one long step: it removes the
  temporaries of writes in flight (:mod:`ster.engine.protocol.inflight`), shows a last
  ``cancelled`` event, and exits 130 at once.

Why not ``Thread.join(timeout)`` inside ``try/except KeyboardInterrupt``: on CPython 3.11
an interrupt landing inside ``join`` can mark a thread that is still running as stopped
(bpo-45274), so the caller read a result that did not exist yet, and the interpreter then
exited under a running torch kernel ("terminate called without an active exception", 134).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import ExitCode
from ster.engine.protocol.events import Error, Event
from ster.engine.protocol.jobs import run_job

CANCELLING = "cancelling: the job stops after its current step and writes nothing; press Ctrl-C again to stop at once"
STOPPED = "stopped at once at the second Ctrl-C; nothing was written"
INTERRUPTED = "interrupted before the job started; nothing was written"


class Foreground:
    """SIGINT handling for one job; use it as a context manager around :meth:`run`.

    The handler is installed on entry and the previous one restored on exit. Off the
    main thread (where Python delivers no signals) it installs nothing.
    """

    def __init__(self, render: Any) -> None:
        self.render = render
        """The job's renderer: it says the Ctrl-C line and shows the last event of an abort."""
        self.cancel = threading.Event()
        self.done = threading.Event()
        self._previous: Any = None

    def __enter__(self) -> Foreground:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def run(self, name: str, request: Any, emit: Callable[[Event], None]) -> Event:
        """Run job ``name`` on a worker thread and return its final event once it has ended."""
        finished: list[Event] = []

        def work() -> None:
            try:
                finished.append(run_job(name, request, emit, self.cancel))
            finally:
                self.done.set()

        threading.Thread(target=work, name=f"ster {name}", daemon=True).start()
        self.done.wait()
        if not finished:  # run_job reports every Exception; only a BaseException gets here
            return Error(kind="internal", message=f"internal error in {name}: the job ended without a final event")
        return finished[0]

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.done.is_set():
            return  # the job has ended; its final event decides the exit status
        if not self.cancel.is_set():
            self.cancel.set()
            self.render.say(CANCELLING)
            return
        inflight.remove_all(hold=True)
        self.render.abort(Error(kind="cancelled", message=STOPPED))
        sys.stderr.flush()
        os._exit(int(ExitCode.CANCELLED))
