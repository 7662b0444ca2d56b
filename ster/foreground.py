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
* the rename that commits the job's output (:func:`ster.engine.protocol.inflight.committing`)
  and this handler take one lock, so each Ctrl-C comes either before it, and the job is
  refused the rename and ends cancelled, or after it, and is told it is too late: the job
  ends with its result. A job that writes nothing and ends with a result after Ctrl-C
  has come ends cancelled instead, so 130 always means nothing was written and 0 that
  the output is complete;
* once the job's final event is settled, that event decides the exit status and Ctrl-C
  is ignored; when the command ends the process, it stays ignored (``SIG_IGN``) after
  :meth:`~Foreground.__exit__`, through the rendering, the flushing and the
  interpreter's finalization, where a Python handler would raise ``KeyboardInterrupt``
  or, once CPython has reset it, let the signal kill the process.

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

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import Cancelled, ExitCode

CANCELLING = (
    "cancelling: the job stops after its current step without writing its output; press Ctrl-C again to stop at once"
)
STOPPED = "stopped at once at the second Ctrl-C; nothing was written"
INTERRUPTED = "interrupted before the job started; nothing was written"
TOO_LATE = "too late to cancel: the job has written its output and ends with its result"

RESTORE = object()
"""For :meth:`Foreground.leave`: give SIGINT back to the handler that was there before."""


def exit_at_once(line: str) -> None:
    """Say ``line`` on stderr and end the process with 130, running no more Python code."""
    os.write(2, (line + "\n").encode())
    os._exit(int(ExitCode.CANCELLED))


def _nothing() -> None:
    return None


class Foreground:
    """SIGINT handling for one command; a context manager around parsing and :meth:`run`.

    The handler is installed on entry; on exit SIGINT is left as :meth:`leave` asked (by
    default, the previous handler is restored). Off the main thread (where Python
    delivers no signals) it installs nothing.
    """

    def __init__(self) -> None:
        self.cancel = threading.Event()
        """The running job's cancel flag, set by the first Ctrl-C."""
        self.done = threading.Event()
        """Set by the worker once the job has emitted its final event."""
        self._render: Any = None
        self._abort: Callable[[], None] = lambda: None
        self._previous: Any = None
        self._after: Any = RESTORE
        self._final: Any = None
        self._told = False
        self._deciding = threading.RLock()  # reentrant: a second Ctrl-C may interrupt the first one's handler

    def __enter__(self) -> Foreground:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous if self._after is RESTORE else self._after)

    def leave(self, disposition: Any) -> None:
        """What SIGINT is on exit: ``signal.SIG_IGN`` when the process ends with the command, a
        handler for what runs next, or :data:`RESTORE`."""
        self._after = disposition

    def run(self, name: str, request: Any, render: Any, runner: Any = None, writes_here: bool = True) -> Any:
        """Run job ``name`` on a worker thread, showing events with ``render``; return its final event.

        ``runner`` runs the job (default: the engine, in this process); it has the shape of
        :func:`~ster.engine.protocol.jobs.run_job`, as a remote server's client does. Where
        the job's output is written elsewhere (a remote runner, a ``torchrun`` rank other than
        0: ``writes_here`` false) its final event is shown as it comes.
        """
        from ster.engine.protocol.events import Error
        from ster.engine.protocol.jobs import run_job

        settles = runner is None and writes_here
        run_job = runner or run_job

        def emit(event: Any) -> None:
            if event.type in ("result", "error"):
                event = self._settle(event, settles)
            render(event)

        finished: list[Any] = []

        def work() -> None:
            try:
                run_job(name, request, emit, self.cancel)
                finished.append(self._final)
            finally:
                self.done.set()

        self._abort = self._aborter(render)
        self._render = render
        threading.Thread(target=work, name=f"ster {name}", daemon=True).start()
        while not self.done.wait(0.1):  # waking now and then runs a handler whose signal reached another thread
            pass
        if not finished or finished[0] is None:  # run_job reports every Exception; only a BaseException gets here
            return Error(kind="internal", message=f"internal error in {name}: the job ended without a final event")
        return finished[0]

    def _settle(self, event: Any, settles: bool) -> Any:
        """The job's final event as shown: a result that comes after Ctrl-C, with nothing written, is a cancellation."""
        from ster.engine.protocol.events import Error

        with self._deciding:
            if settles and event.type == "result" and self.cancel.is_set() and not inflight.committed(self.cancel):
                event = Error(kind="cancelled", message=str(Cancelled()))
            self._final = event
        return event

    @staticmethod
    def _aborter(render: Any) -> Callable[[], None]:
        """What the second Ctrl-C does, with its imports done in advance (the worker may hold the import lock)."""
        from ster.engine.protocol.events import Error

        def abort() -> None:
            inflight.remove_all(hold=True)  # held until the exit: no rename can follow
            render.abort(Error(kind="cancelled", message=STOPPED))
            os._exit(int(ExitCode.CANCELLED))

        return abort

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._render is None:
            exit_at_once(INTERRUPTED)
        with inflight.holding(), self._deciding:  # no commit, and no final event, lands inside the decision
            step = self._decide()
        step()

    def _decide(self) -> Callable[[], None]:
        """What this Ctrl-C does, given how far the job got; sets the cancel flag for the first."""
        if self._final is not None:
            return _nothing  # the job has ended: its final event decides
        if inflight.committed(self.cancel):
            told, self._told = self._told, True
            return _nothing if told else lambda: self._say(TOO_LATE)
        if not self.cancel.is_set():
            self.cancel.set()
            return lambda: self._say(CANCELLING)
        return self._abort

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed stderr must not turn Ctrl-C into a traceback
            self._render.say(line)
