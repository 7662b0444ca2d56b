"""The ``ster`` command: parse flags into a job request, run the job, render its events.

Parsing (the command tree is :mod:`ster.commands`) imports nothing heavy, so ``ster
--help`` and ``ster <command> --help`` load neither torch nor transformers. Each command
maps onto one engine job; this module only builds the request, runs the job in the
foreground (:mod:`ster.foreground`: Ctrl-C) and chooses how events are shown:

* ``ster <command>``: the result document as pretty JSON on stdout; progress on stderr
  (a live display on a terminal, plain lines otherwise);
* ``ster --json <command>``: every event as one JSON object per line on stdout.

Exit codes: 0 success; 1 refused (any bad value: the request model checks every value and
says what is wrong in one sentence; nothing is written); 2 usage error (the command's
shape only: an unknown command or flag, a missing required flag, a flag without its
value); 3 internal error; 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ster.commands import build_parser
from ster.engine.protocol.errors import ExitCode, SterError, exit_code_for
from ster.foreground import RESTORE, Foreground

__all__ = ["build_parser", "main"]


def _request(args: argparse.Namespace) -> Any:
    """The validated request for parsed arguments: every parsed flag becomes a field of the same name."""
    from ster.engine.protocol.jobs import build_job_request

    return build_job_request(args.job, **_fields(args))


LOCAL_ONLY = frozenset({"job", "json", "server", "token_file"})
"""Parsed arguments that steer the command itself rather than its job."""


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The job's request fields: every flag given but the command's own. A flag left out is not parsed at all
    (:mod:`ster.commands`), so the request's own default applies, as it does to a body sent to ``ster serve``."""
    return {k: v for k, v in vars(args).items() if k not in LOCAL_ONLY and not k.endswith("command")}


def _status(final: Any) -> int:
    return int(ExitCode.OK) if final.type == "result" else int(exit_code_for(final.kind))


def _opens_tui(args: argparse.Namespace, argv: Sequence[str] | None) -> bool:
    return args.command == "tui" or (
        args.command is None and argv is None and sys.stdin.isatty() and sys.stdout.isatty()
    )


def _run_tui(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ster.tui.app import run_tui

    pairs = getattr(args, "pairs", None)
    remote = _remote(args)
    if isinstance(remote, int):
        return remote
    return run_tui(getattr(args, "model", None), Path(pairs) if pairs else None, remote=remote)


def _remote(args: argparse.Namespace) -> Any:
    """The server ``--server`` names, with its token; None for a local engine; an exit status for a bad token file."""
    if not getattr(args, "server", None):
        return None
    from ster.serve.client import Remote
    from ster.serve.guard import CLIENT_TOKEN_ENV, read_token
    from ster.serve.wire import WireRefusal

    try:
        token = read_token(getattr(args, "token_file", None), CLIENT_TOKEN_ENV)
        return Remote(args.server, token)
    except WireRefusal as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(ExitCode.REFUSED)


def _job(args: argparse.Namespace, foreground: Foreground) -> int:
    """Check the request, run the job in the foreground, and map its final event to the exit status."""
    from ster.console import renderer_for, torchrun_rank
    from ster.engine.protocol.events import Error

    render = renderer_for(json_mode=args.json)
    remote = _remote(args)
    if isinstance(remote, int):
        return remote
    if remote is not None:  # the server checks the fields: paths name its files, not ours
        final = foreground.run(args.job, _fields(args), render, runner=remote.run_job)
        render.close()
        return _status(final)
    try:
        request = _request(args)
    except SterError as exc:
        render(Error(kind=exc.kind, message=str(exc)))
        return int(exc.exit_code)
    final = foreground.run(args.job, request, render, writes_here=not torchrun_rank())
    render.close()
    return _status(final)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ster`` console script; returns the exit status.

    Ctrl-C is :class:`~ster.foreground.Foreground`'s from parsing to the job's end; the
    TUI, which reads Ctrl-C as a key, runs outside it. Without ``argv`` this is the
    process's own command line, and the process ends when it returns (``python -m ster``,
    the ``ster`` script): SIGINT is then left ignored, so that nothing between the job's
    end and the exit (the result's rendering, the flushing, the interpreter's and torch's
    teardown) turns a late Ctrl-C into a traceback, death by the signal, or another status.
    ``ster serve`` is stopped by SIGINT instead (:func:`_stopped_serving`).
    """
    with Foreground() as foreground:
        if argv is None:
            foreground.leave(signal.SIG_IGN)
        parser = build_parser()
        args = parser.parse_args(argv)
        tui = _opens_tui(args, argv)
        if not tui and args.command is None:
            parser.print_help()
            return int(ExitCode.OK)
        if args.command == "request":
            from ster.serve.request import run_request

            return run_request(args.operation, foreground)
        if not tui and args.command != "serve":
            code = _job(args, foreground)
            if _a_torchrun_rank():
                _end_rank(code)
            return code
        foreground.leave(_stopped_serving if args.command == "serve" and argv is None else RESTORE)
    if args.command == "serve":  # outside the Foreground: the server stops itself on SIGINT and SIGTERM
        from ster.serve.server import serve as run_server

        return run_server(args.host, args.port, args.token_file, args.root, args.model or [])
    return _run_tui(args)


def _stopped_serving(signum: int, frame: Any) -> None:
    """SIGINT for ``ster serve`` outside uvicorn's own handler: exit 130 at once, quietly, writing nothing.

    It runs for a Ctrl-C while the server starts (before uvicorn handles SIGINT) and when
    uvicorn, having stopped the server gracefully, raises the SIGINT it caught again. The
    jobs were cancelled by then, and a cancelled job never renames its output into place;
    holding the lock of writes in flight keeps a job still inside its last step from doing
    so, and their temporaries are removed.
    """
    from ster.engine.protocol import inflight

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    inflight.remove_all(hold=True)
    os._exit(int(ExitCode.CANCELLED))


def _a_torchrun_rank() -> bool:
    """Whether this process is one of several that ``torchrun`` started and joined a process group."""
    return "torch.distributed" in sys.modules and int(os.environ.get("WORLD_SIZE", "1")) > 1


def _end_rank(code: int) -> None:
    """End a ``torchrun`` rank whose job succeeded or was cancelled now, its output flushed,
    without the interpreter's finalization.

    gloo's worker threads release a collective's tensors just after the collective has
    returned, and releasing a tensor that Python has seen takes the GIL. A thread that
    asks for the GIL while CPython 3.11 finalizes is ended with ``pthread_exit``, which
    inside C++ code is ``std::terminate``: a rank that exits right after its last
    collective aborted (SIGABRT) after its work had succeeded, about one run in thirty on
    a loaded 2-core machine. Everything the job writes is written and flushed by now, so
    nothing is lost by skipping finalization.

    A rank that failed finalizes as usual: it failed in its own work, long after its last
    collective, and finalizing closes its connections before the process ends, so the
    other ranks' collectives fail and each says why it stopped before ``torchrun`` ends
    them (a tenth of a second after the first rank exits).
    """
    if code not in (ExitCode.OK, ExitCode.CANCELLED):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream has nothing left to say
            pass
    os._exit(code)
