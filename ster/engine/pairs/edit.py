"""The ``pairs add`` and ``pairs remove`` jobs: editing a pair-set file one pair at a time.

Every write validates the whole set first and replaces the file atomically, so a
refused edit leaves the file exactly as it was.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from ster.engine.protocol.errors import Refusal
from ster.engine.pairs.first_use import note_pair_set_written
from ster.engine.protocol.jobs import JobContext
from ster.engine.pairs.model import Pair, PairSet, load_pairs, save_pairs
from ster.engine.pairs.requests import PairsAddRequest, PairsRemoveRequest, PairsSaveRequest


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
    path, created = request.pairs, not request.pairs.exists()
    if created:
        if not request.trait:
            raise Refusal(f"pair set {path} does not exist yet; give --trait to name the trait it collects")
        pair_set = PairSet(trait_name=request.trait, pairs=[])
    else:
        pair_set = load_pairs(path)
    pairs = [*pair_set.pairs, Pair(positive=request.positive, negative=request.negative)]
    updated = PairSet(trait_name=request.trait or pair_set.trait_name, pairs=pairs)
    save_pairs(path, updated)
    note_pair_set_written(path)
    return _result(path, "added", len(pairs) - 1, created, updated)


def remove_job(request: PairsRemoveRequest, ctx: JobContext) -> PairsEditResult:
    pair_set = load_pairs(request.pairs)
    count = len(pair_set.pairs)
    if not 0 <= request.index < count:
        raise Refusal(f"pair index {request.index} is outside the set's 0..{count - 1} range")
    pairs = [pair for i, pair in enumerate(pair_set.pairs) if i != request.index]
    updated = PairSet(trait_name=pair_set.trait_name, pairs=pairs)
    save_pairs(request.pairs, updated)  # refuses an emptied set: a set is validated before it is saved
    return _result(request.pairs, "removed", request.index, False, updated)


def save_job(request: PairsSaveRequest, ctx: JobContext) -> PairsEditResult:
    """Write a whole set; the editor's save. Validation refuses an empty set or an empty side."""
    created = not request.pairs.exists()
    save_pairs(request.pairs, request.pair_set)
    note_pair_set_written(request.pairs)
    return _result(request.pairs, "saved", len(request.pair_set.pairs) - 1, created, request.pair_set)


def _result(path: Path, action: str, index: int, created: bool, pair_set: PairSet) -> PairsEditResult:
    return PairsEditResult(pairs=str(path), action=action, index=index, created=created,
                           trait_name=pair_set.trait_name, pair_count=len(pair_set.pairs))

