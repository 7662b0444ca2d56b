"""What ``ster serve`` holds a client to, so a client that stalls or misbehaves cannot hold it up.

* **Time.** A connection has :data:`HEADER_TIMEOUT` seconds from its opening to deliver its
  request's headers, and a body may pause at most :data:`BODY_TIMEOUT` seconds between two of
  its chunks; past either the connection is closed (a late body gets ``408`` first). Between
  requests an idle keep-alive connection is closed after :data:`IDLE_TIMEOUT`. The tests shorten
  them through ``STER_SERVE_HEADER_TIMEOUT`` and ``STER_SERVE_BODY_TIMEOUT`` (seconds).
* **No traceback.** Whatever escapes a handler, a stream, a worker thread or the event loop is
  said in one line on stderr (``error: …``) and answered, while an answer can still be given, as
  ``500 {"error": "<sentence>"}``; a traceback is printed only with ``STER_DEBUG=1``.

Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import Any

HEADER_TIMEOUT = float(os.environ.get("STER_SERVE_HEADER_TIMEOUT") or 10.0)
"""Seconds a new connection has to deliver its request's headers."""
BODY_TIMEOUT = float(os.environ.get("STER_SERVE_BODY_TIMEOUT") or 30.0)
"""Seconds a request body may pause between two chunks."""
IDLE_TIMEOUT = 5.0
"""Seconds an idle keep-alive connection is kept (uvicorn's default)."""
SLOW_BODY = f"the request body stalled for more than {BODY_TIMEOUT:g} s, so the connection is closed"


def say(line: str) -> None:
    """One line on the server's stderr; a closed stderr is ignored."""
    try:
        sys.stderr.write(line.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def sentence(exc: BaseException) -> str:
    """An unexpected exception as one sentence."""
    from ster.engine.protocol.errors import first_sentence

    return f"{type(exc).__name__}: {first_sentence(exc)}"


def debug() -> bool:
    return bool(os.environ.get("STER_DEBUG"))


class OneLine(logging.Filter):
    """A log record with an exception becomes one line: the message and the exception's sentence."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not debug():
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {sentence(exc) if exc else ''}".rstrip(": ")
            record.args = None
            record.exc_info = record.exc_text = None
            record.stack_info = None
        return True


def quiet_logging() -> None:
    """Make uvicorn's, asyncio's and the threads' reports of an exception one line each."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.asgi", "asyncio"):
        logger = logging.getLogger(name)
        logger.addFilter(OneLine())
        for handler in logger.handlers:
            handler.addFilter(OneLine())

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        say(
            f"error: a server thread ({args.thread.name if args.thread else '?'}) stopped: "
            f"{sentence(args.exc_value) if args.exc_value else args.exc_type.__name__}"
        )

    if not debug():
        threading.excepthook = thread_hook


def loop_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's handler: one line, not asyncio's traceback."""
    exc = context.get("exception")
    say(f"error: {context.get('message', 'event loop error')}{': ' + sentence(exc) if exc else ''}")


def protocol() -> type:
    """uvicorn's HTTP/1.1 protocol, with a deadline for a connection's first request headers."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Deadlined(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(loop_exceptions)
            self._headers_due: asyncio.TimerHandle | None = loop.call_later(HEADER_TIMEOUT, self._headers_late)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None:
                self._stop_clock()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_clock()
            super().connection_lost(exc)

        def _stop_clock(self) -> None:
            due = getattr(self, "_headers_due", None)
            if due is not None:
                due.cancel()
                self._headers_due = None

        def _headers_late(self) -> None:
            self._headers_due = None
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()  # nothing can be answered to a request that never arrived

    return Deadlined
