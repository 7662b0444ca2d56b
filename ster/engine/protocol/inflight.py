"""The temporary files and directories of atomic writes still in flight in this process.

An atomic write (see :mod:`ster.engine.protocol.files`) leaves nothing behind when it
fails or is cancelled, because its own ``except`` removes the temporary. A process that
has to end at once — the CLI's second Ctrl-C, which cannot wait for a job busy inside
torch — never runs that ``except``. It calls :func:`remove_all` instead, so even an
immediate exit writes nothing: the destination is only ever touched by the final rename.

Creating a temporary and registering it happen under one lock, which :func:`remove_all`
takes too, so no temporary exists unregistered when the sweep runs.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_paths: set[Path] = set()


def temp_file(**mkstemp: Any) -> tuple[int, str]:
    """``tempfile.mkstemp(**mkstemp)``, registered until :func:`unregister`."""
    with _lock:
        fd, name = tempfile.mkstemp(**mkstemp)
        _paths.add(Path(name))
    return fd, name


def temp_directory(**mkdtemp: Any) -> str:
    """``tempfile.mkdtemp(**mkdtemp)``, registered until :func:`unregister`."""
    with _lock:
        name = tempfile.mkdtemp(**mkdtemp)
        _paths.add(Path(name))
    return name


def register(path: str | Path) -> None:
    """Track a temporary created elsewhere (prefer :func:`temp_file`, which leaves no gap)."""
    with _lock:
        _paths.add(Path(path))


def unregister(path: str | Path) -> None:
    """Forget a temporary: it was renamed into place or removed by its writer."""
    with _lock:
        _paths.discard(Path(path))


def in_flight() -> list[Path]:
    """The temporaries registered now, for tests and diagnostics."""
    with _lock:
        return sorted(_paths)


def remove_all(hold: bool = False, timeout: float = 2.0) -> None:
    """Remove every registered temporary, for a process about to end without unwinding.

    With ``hold`` the lock stays taken, so no writer creates another temporary between
    this sweep and the exit; a temporary removed here can no longer be renamed into
    place. ``timeout`` bounds the wait for a writer that holds the lock (it does only
    while creating a temporary).
    """
    acquired = _lock.acquire(timeout=timeout)
    try:
        for path in list(_paths):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            _paths.discard(path)
    finally:
        if acquired and not hold:
            _lock.release()
