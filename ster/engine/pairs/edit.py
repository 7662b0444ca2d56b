"""The ``pairs add``, ``pairs remove`` and ``pairs save`` jobs: editing a pair-set file.

Every write validates the whole set first and replaces the file atomically, so a
refused edit leaves the file exactly as it was. Each read-modify-write holds an
exclusive lock across processes (:func:`editing`), so edits that run at once all land.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

from ster.engine.pairs.first_use import note_pair_set_written
from ster.engine.pairs.model import Pair, PairSet, check_pairs, load_pairs, save_pairs
from ster.engine.pairs.requests import PairsAddRequest, PairsRemoveRequest, PairsSaveRequest
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import PAIR_SET, check_output_file, written_path
from ster.engine.protocol.jobs import JobContext

try:  # POSIX only; elsewhere each write is still atomic, just unlocked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # (no module here: the name says so)


class PairsEditResult(BaseModel):
    """What ``pairs add`` and ``pairs remove`` print."""

    pairs: str
    """The file written."""
    action: str
    """``added``, ``removed`` or ``saved``."""
    index: int
    """Index of the pair added or removed (the last pair's, for a save)."""
    created: bool
    """Whether the file was created by this edit."""
    trait_name: str
    pair_count: int


def add_job(request: PairsAddRequest, ctx: JobContext) -> PairsEditResult:
    """Append one pair; a new file is created, named by ``--trait`` (or left unnamed without it)."""
    path, pair = request.pairs, Pair(positive=request.positive, negative=request.negative)
    check_pairs(PairSet(pairs=[pair]), path)  # refuse an empty side before anything is created
    check_output_file(path)
    with editing(path, create=True):
        created = not confine.readable(path).exists()
        pair_set = PairSet(pairs=[]) if created else load_pairs(path)
        trait_name = pair_set.trait_name if request.trait is None else request.trait
        updated = PairSet(trait_name=trait_name, pairs=[*pair_set.pairs, pair])
        save_pairs(path, updated)
    note_pair_set_written(path)
    return _result(path, "added", len(updated.pairs) - 1, created, updated)


def remove_job(request: PairsRemoveRequest, ctx: JobContext) -> PairsEditResult:
    with editing(request.pairs):
        pair_set = load_pairs(request.pairs)
        count = len(pair_set.pairs)
        if not 0 <= request.index < count:
            raise Refusal(f"pair index {request.index} is outside the set's 0..{count - 1} range")
        pairs = [pair for i, pair in enumerate(pair_set.pairs) if i != request.index]
        updated = PairSet(trait_name=pair_set.trait_name, pairs=pairs)
        save_pairs(request.pairs, updated)  # refuses an emptied set: a set is validated before it is saved
    return _result(request.pairs, "removed", request.index, False, updated)


def save_job(request: PairsSaveRequest, ctx: JobContext) -> PairsEditResult:
    """Write a whole set; the editor's save. Validation refuses an empty set or an empty side, and a
    file that holds anything but a pair set is never replaced."""
    check_pairs(PairSet.model_validate(request.pair_set.model_dump()), request.pairs)
    check_output_file(request.pairs, PAIR_SET, ctx.log)
    with editing(request.pairs, create=True):
        created = not confine.readable(request.pairs).exists()
        save_pairs(request.pairs, request.pair_set)
    note_pair_set_written(request.pairs)
    return _result(request.pairs, "saved", len(request.pair_set.pairs) - 1, created, request.pair_set)


@contextmanager
def editing(path: Path, create: bool = False) -> Iterator[None]:
    """Hold an exclusive lock for one read-modify-write of the set at ``path``, across processes.

    The lock is a ``flock`` on the directory that holds the set. Not on the file: every write
    renames a new file over it, so a process waiting on the old file's lock would wake up
    holding a lock nobody else takes, and read a file that is already gone. Not on a lock file
    beside it: that file could never be deleted safely (a waiter may hold it open), so it would
    stay next to every set. The directory outlives every rename; the cost is that edits of two
    sets in one directory take turns, for the milliseconds an edit lasts. ``create`` makes the
    directory first (``pairs add`` to a new path); without it a missing directory means there is
    no set to edit, which the load then says.
    """
    directory = written_path(path).absolute().parent
    if fcntl is None or not (create or directory.is_dir()):
        yield
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
    except OSError as exc:
        raise Refusal(
            f"pair set {path} cannot be edited: {directory} could not be opened ({exc.strerror or exc})"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _result(path: Path, action: str, index: int, created: bool, pair_set: PairSet) -> PairsEditResult:
    return PairsEditResult(
        pairs=str(path),
        action=action,
        index=index,
        created=created,
        trait_name=pair_set.trait_name,
        pair_count=len(pair_set.pairs),
    )
