"""The pair-set document: ``{"trait_name": ..., "pairs": [{"positive": ..., "negative": ...}]}``.

A positive and a negative text that differ only in the trait. The document is
validated whole, with the refusal sentences the rest of Ster uses, before anything
reads or writes it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import dumps_pretty, first_error, read_json, write_atomic
from ster.engine.protocol.kinds import PAIR_SET, document_kind, with_article


class Pair(BaseModel):
    """One contrastive pair."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    positive: str
    """The text that shows the trait."""
    negative: str
    """The matched text that does not."""


class PairSet(BaseModel):
    """A named set of pairs."""

    model_config = ConfigDict(extra="forbid")
    trait_name: str = ""
    """The trait the pairs collect; a set may leave it out (as the original allows), and is then unnamed."""
    pairs: list[Pair]


def check_pairs(pair_set: PairSet, path: Path | str) -> PairSet:
    """Refuse an empty set, or a pair with an empty side."""
    if not pair_set.pairs:
        raise Refusal(f"pair set {path} contains no pairs")
    if any(not p.positive.strip() or not p.negative.strip() for p in pair_set.pairs):
        raise Refusal(f"pair set {path} contains an empty positive or negative prompt")
    return pair_set


def load_pairs(path: Path) -> PairSet:
    """Read and validate a pair-set file."""
    raw = read_json(path, "pair set")
    kind = document_kind(raw)
    if kind not in (None, PAIR_SET):
        raise Refusal(f"{path} is {with_article(kind)}, not a pair set")
    try:
        pair_set = PairSet.model_validate(raw)
    except ValidationError as exc:
        raise Refusal(f"pair set {path} is not in the expected shape: {first_error(exc)}") from None
    return check_pairs(pair_set, path)


def save_pairs(path: Path, pair_set: PairSet) -> None:
    """Validate the whole set, then write it atomically as pretty JSON with a trailing newline."""
    check_pairs(PairSet.model_validate(pair_set.model_dump()), path)
    write_atomic(path, dumps_pretty(pair_set.model_dump(mode="json")))
