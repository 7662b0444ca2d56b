"""One job in the foreground of a terminal, where Ctrl-C means "stop, and write nothing".

:class:`Foreground` owns SIGINT from the moment the command line is parsed until the job
has ended, and Ctrl-C never raises ``KeyboardInterrupt`` in that time:

* before the job starts (parsing, imports, checking the request) nothing has been
  written and no thread runs, so it says one line and exits 130 at once. Raising
  instead would leave it to chance: an interrupt inside an extension module's import
  becomes that module's error (pydantic-core turns it into a panic), and one inside
  ``exec`` makes CPython 3.11 end the process by SIGINT even after it was caught;
* while the job runs, the first Ctrl-C sets the job's cancel flag and says so in one
  line; the job stops at its next check, between units of work, and ends with the
  ``cancelled`` error event (exit 130), its atomic writes never committed;
* a second Ctrl-C does not wait for a job busy inside one long step: it removes the
  temporaries of writes in flight (:mod:`ster.engine.protocol.inflight`), shows a last
  ``cancelled`` event, and exits 130 at once;
* once the job has ended, its final event decides the exit status and Ctrl-C is ignored.

The job runs on a worker thread and the main thread waits on an :class:`threading.Event`
the worker sets when the job has emitted its final event. The old wait,
``Thread.join(timeout)`` inside ``try/except KeyboardInterrupt``, broke on CPython 3.11:
an interrupt landing inside ``join`` can mark a still-running thread as stopped
(bpo-45274), so the caller read a result that did not exist yet, and the interpreter
exited under a running torch kernel ("terminate called without an active exception", 134).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ster.engine.protocol.errors import ExitCode

CANCELLING = ("cancelling: the job stops after its current step without writing its output; press Ctrl-C again "
              "to stop at once")
STOPPED = "stopped at once at the second Ctrl-C; nothing was written"
INTERRUPTED = "interrupted before the job started; nothing was written"


def exit_at_once(line: str) -> None:
    """Say ``line`` on stderr and end the process with 130, running no more Python code."""
    os.write(2, (line + "\n").encode())
    os._exit(int(ExitCode.CANCELLED))


class Foreground:
    """SIGINT handling for one command; a context manager around parsing and :meth:`run`.

    The handler is installed on entry and the previous one restored on exit. Off the
    main thread (where Python delivers no signals) it installs nothing.
    """

    def __init__(self) -> None:
        self.cancel = threading.Event()
        """The running job's cancel flag, set by the first Ctrl-C."""
        self.done = threading.Event()
        """Set by the worker once the job has emitted its final event."""
        self._render: Any = None
        self._abort: Callable[[], None] = lambda: None
        self._previous: Any = None

    def __enter__(self) -> Foreground:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def run(self, name: str, request: Any, render: Any, runner: Any = None) -> Any:
        """Run job ``name`` on a worker thread, showing events with ``render``; return its final event.

        ``runner`` runs the job (default: the engine, in this process); it has the shape of
        :func:`~ster.engine.protocol.jobs.run_job`, as a remote server's client does.
        """
        from ster.engine.protocol.events import Error
        from ster.engine.protocol.jobs import run_job

        run_job = runner or run_job

        finished: list[Any] = []

        def work() -> None:
            try:
                finished.append(run_job(name, request, render, self.cancel))
            finally:
                self.done.set()

        self._abort = self._aborter(render)
        self._render = render
        threading.Thread(target=work, name=f"ster {name}", daemon=True).start()
        while not self.done.wait(0.1):  # waking now and then runs a handler whose signal reached another thread
            pass
        if not finished:  # run_job reports every Exception; only a BaseException gets here
            return Error(kind="internal", message=f"internal error in {name}: the job ended without a final event")
        return finished[0]

    @staticmethod
    def _aborter(render: Any) -> Callable[[], None]:
        """What the second Ctrl-C does, with its imports done in advance (the worker may hold the import lock)."""
        from ster.engine.protocol import inflight
        from ster.engine.protocol.events import Error

        def abort() -> None:
            inflight.remove_all(hold=True)
            render.abort(Error(kind="cancelled", message=STOPPED))
            os._exit(int(ExitCode.CANCELLED))

        return abort

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._render is None:
            exit_at_once(INTERRUPTED)
        elif self.done.is_set():
            return
        elif not self.cancel.is_set():
            self.cancel.set()
            with contextlib.suppress(OSError):  # a closed stderr must not turn Ctrl-C into a traceback
                self._render.say(CANCELLING)
        else:
            self._abort()
