"""The temporary files and directories of atomic writes still in flight, and those a dead writer left.

An atomic write (see :mod:`ster.engine.protocol.files`) leaves nothing behind when it
fails or is cancelled, because its own ``except`` removes the temporary. A process that
has to end at once — the CLI's second Ctrl-C, which cannot wait for a job busy inside
torch — never runs that ``except``. It calls :func:`remove_all` instead, so even an
immediate exit writes nothing: the destination is only ever touched by the final rename.

Creating a temporary and registering it happen under one lock, which :func:`remove_all`
takes too, so no temporary exists unregistered when the sweep runs.

A process killed outright (SIGKILL, a power cut) runs no code at all, so its temporaries
stay. Each one is therefore held, for the whole of its life, under an exclusive
``flock`` taken on it the moment it is created, and released only when it is renamed
into place or removed; the kernel drops the lock of a process that dies. Before a new
temporary is made in a directory, :func:`reclaim` looks there for temporaries of Ster's
own naming (:data:`PATTERN`) and tries each one's lock without waiting: a lock it gets
means the writer is dead, and the temporary is removed; a lock it cannot get belongs to
a live writer, in this process or another, and that temporary is left alone. A lock
names an open file, not a process id, so a reused process id cannot make a stale
temporary look alive or a live one look stale.

The final renames that commit a job's output happen under that lock too
(:func:`committing`), which makes a commit one step against Ctrl-C: a job whose cancel
flag is set before its output's rename never makes it (the rename raises
:class:`~ster.engine.protocol.errors.Cancelled`), a sweep that comes while a rename is
under way waits for it, and :func:`committed` tells a front end that the job has written,
so that it no longer reports the job as cancelled.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ster.engine.protocol.errors import Cancelled

try:
    import fcntl
except ImportError:  # not POSIX: temporaries are not locked, so none is ever judged stale
    fcntl = None  # type: ignore[assignment]  # (no module here: the name says so)

SUFFIX = ".ster.tmp"
"""How the name of every temporary of an atomic write ends (``.NAME.<random>.ster.tmp``)."""
PATTERN = re.compile(r"\..+\.ster\.tmp|\.ster-probe\.[a-z0-9_]{8}\.tmp")
"""Ster's own temporaries, the only names :func:`reclaim` ever touches: those of atomic writes and the
probe a check of an output's directory makes (``.ster-probe.<random>.tmp``)."""

_lock = threading.Lock()
_paths: dict[Path, int | None] = {}
"""Every registered temporary → the descriptor that holds its lock (None where none could be taken)."""
_job = threading.local()
"""``cancel``: the cancel flag of the job running on this thread, while :func:`job_writes` holds."""
_committed: weakref.WeakSet[threading.Event] = weakref.WeakSet()
"""The cancel flags of jobs that have committed an output."""


def temp_file(**mkstemp: Any) -> tuple[int, str]:
    """``tempfile.mkstemp(**mkstemp)``, locked and registered until :func:`unregister`.

    Stale temporaries in the same directory are reclaimed first.
    """
    if mkstemp.get("dir") is not None:
        reclaim(Path(mkstemp["dir"]))
    with _lock:
        while True:
            fd, name = tempfile.mkstemp(**mkstemp)
            held = _hold(fd, name)
            if held is not False:
                break
            os.close(fd)  # another process reclaimed it in the instant before the lock: make another
        _paths[Path(name)] = held
    return fd, name


def temp_directory(**mkdtemp: Any) -> str:
    """``tempfile.mkdtemp(**mkdtemp)``, locked and registered until :func:`unregister`.

    Stale temporaries in the same directory are reclaimed first.
    """
    if mkdtemp.get("dir") is not None:
        reclaim(Path(mkdtemp["dir"]))
    with _lock:
        while True:
            name = tempfile.mkdtemp(**mkdtemp)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            held = _hold(fd, name)
            os.close(fd)
            if held is not False:
                break
        _paths[Path(name)] = held
    return str(name)


def _hold(fd: int, name: str) -> int | bool | None:
    """Lock the temporary just made at ``name`` (open as ``fd``); the descriptor that now holds the lock,
    None where locks are not available, or False when another process removed it before the lock was taken
    (a reclaimer may hold the lock of a temporary in the instant between its creation and its lock)."""
    if fcntl is None:
        return None
    held = os.dup(fd)  # the caller closes ``fd`` when it has written; the lock lives as long as the duplicate
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
    except OSError:  # a file system without locks: the temporary is never judged stale, so never reclaimed
        os.close(held)
        return None
    if _same(os.fstat(held), name):
        return held
    os.close(held)
    return False


def _same(status: os.stat_result, name: str | Path) -> bool:
    try:
        now = os.stat(name, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino)


def register(path: str | Path) -> None:
    """Track a temporary created elsewhere (prefer :func:`temp_file`, which leaves no gap, and locks it)."""
    with _lock:
        _paths.setdefault(Path(path), None)


def unregister(path: str | Path) -> None:
    """Forget a temporary, releasing its lock: it was renamed into place or removed by its writer."""
    with _lock:
        held = _paths.pop(Path(path), None)
    if held is not None:
        os.close(held)


def in_flight() -> list[Path]:
    """The temporaries registered now, for tests and diagnostics."""
    with _lock:
        return sorted(_paths)


def reclaim(directory: Path) -> list[Path]:
    """Remove every temporary of Ster's naming in ``directory`` whose writer is dead; what was removed.

    Only a regular file or a directory whose name matches :data:`PATTERN`, owned by this user, is
    looked at, never through a symbolic link; one whose lock is held (a live writer's) is left.
    Nothing fails: what cannot be judged or removed is left as it is.
    """
    if fcntl is None:
        return []
    try:
        names = [name for name in os.listdir(directory) if PATTERN.fullmatch(name)]
    except OSError:
        return []
    with _lock:
        mine = set(_paths)
    return [directory / name for name in names if directory / name not in mine and _reclaim(directory / name)]


def _reclaim(path: Path) -> bool:
    try:
        seen = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    if not (stat.S_ISREG(seen.st_mode) or stat.S_ISDIR(seen.st_mode)) or seen.st_uid != os.getuid():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        # once the lock is ours no writer can take it; the name must still be the file that was locked
        if not _dead(fd) or not _same(os.fstat(fd), path):
            return False
        if stat.S_ISDIR(seen.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _dead(fd: int) -> bool:
    """Whether the writer of the temporary open as ``fd`` is gone: its lock can be taken without waiting."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def remove_all(hold: bool = False, timeout: float = 2.0) -> None:
    """Remove every registered temporary, for a process about to end without unwinding.

    With ``hold`` the lock stays taken, so no writer creates another temporary between
    this sweep and the exit; a temporary removed here can no longer be renamed into
    place. ``timeout`` bounds the wait for a writer that holds the lock (it does only
    while creating a temporary).
    """
    acquired = _lock.acquire(timeout=timeout)
    try:
        for path, held in list(_paths.items()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            del _paths[path]
            if held is not None:
                os.close(held)
    finally:
        if acquired and not hold:
            _lock.release()


@contextmanager
def job_writes(cancel: threading.Event) -> Iterator[None]:
    """Within this block, this thread's commits belong to the job whose cancel flag is ``cancel``."""
    outer = getattr(_job, "cancel", None)  # a job may run another inside itself
    _job.cancel = cancel
    try:
        yield
    finally:
        _job.cancel = outer


@contextmanager
def committing(targets: Sequence[Path], keep: bool = False) -> Iterator[None]:
    """Hold the lock around the renames that put ``targets`` in place: the commit of a write.

    Inside a job (:func:`job_writes`) a commit is refused with ``Cancelled`` once the job's
    cancel flag is set, and marks the job as having written. Two kinds of write are no
    commit: ``keep`` (a training run's checkpoint, written on cancel on purpose) and one
    into a staging directory still in flight, which only that directory's rename commits.
    The mark is set even when a rename fails, since the first of several may have landed.
    """
    with _lock:
        cancel: threading.Event | None = getattr(_job, "cancel", None)
        counts = cancel is not None and not keep and not _staged(targets)
        if counts and cancel is not None and cancel.is_set():
            raise Cancelled()
        try:
            yield
        finally:
            if counts and cancel is not None:
                _committed.add(cancel)


def _staged(targets: Sequence[Path]) -> bool:
    """Whether every target lies inside a registered temporary directory (call with the lock held)."""
    staging = {Path(os.path.realpath(p)) for p in _paths}  # real paths: a server's root writes through descriptors
    return all(not staging.isdisjoint(Path(os.path.realpath(t)).parents) for t in targets)


def committed(cancel: threading.Event) -> bool:
    """Whether the job with this cancel flag has committed an output (lock-free: the writer marked it first)."""
    return cancel in _committed


@contextmanager
def holding(timeout: float = 1.0) -> Iterator[None]:
    """The lock for a decision no commit may interleave with; ``timeout`` bounds the wait for a stuck writer."""
    acquired = _lock.acquire(timeout=timeout)
    try:
        yield
    finally:
        if acquired:
            _lock.release()
