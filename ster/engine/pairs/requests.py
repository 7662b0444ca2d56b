"""Requests of the pair-set jobs: inspect, add, remove, save, synthesize, the workspace and onboarding."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import field_validator

from ster.engine.model.requests import ChatMode, Device, Precision
from ster.engine.pairs.model import PairSet
from ster.engine.protocol.naming import flag
from ster.engine.protocol.requests import Request, at_least_one, between, not_negative, nucleus, seed, temperature


class PairsInspectRequest(Request):
    """``ster pairs inspect``: duplicates, refusals, balance and diversity of a pair set, and with a model,
    each side's length against its context; no weights are read."""

    pairs: Path | None = None
    """The pair set; the workspace's active set when omitted (and no ``pair_set`` is given)."""
    pair_set: PairSet | None = None
    """A set held in memory (the TUI's editor), inspected instead of a file."""
    dedupe_bits: int = 3
    """Two pairs are near-duplicates when their SimHash fingerprints differ in at most this many bits."""
    dedupe_bands: int = 8
    """LSH bands the 64-bit fingerprint is cut into to find candidate near-duplicates."""
    refusal_threshold: float = 0.5
    """A side scoring at or above this reads as a refusal."""
    model: str | None = None
    """A checkpoint whose tokenizer and config count each side against the context; its weights stay unread."""
    revision: str | None = None
    chat_template: ChatMode = "auto"
    """How the sides are encoded for the count, exactly as ``train`` would encode them."""

    _bits = field_validator("dedupe_bits")(lambda cls, v: between(v, 0, 63, "dedupe_bits"))
    _bands = field_validator("dedupe_bands")(lambda cls, v: between(v, 1, 64, "dedupe_bands"))
    _threshold = field_validator("refusal_threshold")(lambda cls, v: _threshold(v))


class PairsAddRequest(Request):
    """``ster pairs add``: append one pair, creating the file and its directory when missing."""

    outputs: ClassVar[tuple[str, ...]] = ("pairs",)
    pairs: Path
    positive: str
    negative: str
    trait: str | None = None
    """Sets or replaces the set's trait name."""


class PairsSaveRequest(Request):
    """Write a whole pair set (the TUI's editor saving), validated first, atomically."""

    outputs: ClassVar[tuple[str, ...]] = ("pairs",)
    pairs: Path
    pair_set: PairSet


class PairsRemoveRequest(Request):
    """``ster pairs remove``: drop the pair at a zero-based index."""

    outputs: ClassVar[tuple[str, ...]] = ("pairs",)
    pairs: Path
    index: int

    _index = field_validator("index")(lambda cls, v: not_negative(v, "index"))


class PairsSynthesizeRequest(Request):
    """``ster pairs synthesize``: write a pair set from a one-sentence trait description."""

    trait: str
    """The trait, described in one sentence."""
    count: int
    output: Path
    generator: str = "local"
    """``local`` (the engine's own generation) or ``brama`` (a hosted model through the Brama gateway)."""
    generator_model: str | None = None
    """The Brama route: a declared alias, a canonical provider/model route, or a selector."""
    model: str | None = None
    revision: str | None = None
    device: Device = "cpu"
    chat_template: ChatMode = "auto"
    precision: Precision = "f32"
    trait_name: str | None = None
    opposite: str | None = None
    """The opposite trait; derived with one generation when omitted."""
    retry_multiplier: int = 3
    dedupe_bits: int = 3
    dedupe_bands: int = 8
    refusal_threshold: float = 0.5
    max_new_tokens: int = 96
    temperature: float = 0.9
    top_p: float | None = 0.95
    seed: int = 42

    _count = field_validator("count")(lambda cls, v: at_least_one(v, "count"))
    _retries = field_validator("retry_multiplier")(lambda cls, v: at_least_one(v, "retry_multiplier"))
    _tokens = field_validator("max_new_tokens")(lambda cls, v: at_least_one(v, "max_new_tokens"))
    _bits = field_validator("dedupe_bits")(lambda cls, v: between(v, 0, 63, "dedupe_bits"))
    _bands = field_validator("dedupe_bands")(lambda cls, v: between(v, 1, 64, "dedupe_bands"))
    _top_p = field_validator("top_p")(lambda cls, v: nucleus(v))
    _temperature = field_validator("temperature")(lambda cls, v: temperature(v))
    _seed = field_validator("seed")(lambda cls, v: seed(v))
    _threshold = field_validator("refusal_threshold")(lambda cls, v: _threshold(v))

    @field_validator("generator")
    @classmethod
    def _generator(cls, value: str) -> str:
        if value not in ("local", "brama"):
            raise ValueError(f'unknown generator "{value}"; expected local or brama')
        return value


def _threshold(value: float) -> float:
    """Refusal scores lie between 0 and 1, so a threshold outside them would flag every side or none."""
    if not 0 <= value <= 1:
        raise ValueError(f"{flag('refusal_threshold')} must be between 0 and 1")
    return value


class WorkspaceImportRequest(Request):
    """``ster workspace import-pairs``: keep a canonical copy of a pair set and make it active."""

    source: Path
    name: str | None = None
    """The id of the copy; the file name (without .json) when omitted."""


class WorkspaceShowRequest(Request):
    """``ster workspace show``: the imported sets and which one is active."""


class WorkspaceSelectRequest(Request):
    """``ster workspace select``: make an imported set the active one."""

    id: str


class WorkspaceRemoveRequest(Request):
    """``ster workspace remove``: forget an imported set and delete its copy."""

    id: str


class OnboardingRequest(Request):
    """``ster onboarding``: the first-use walkthrough, replayed or started over."""

    reset: bool = False
    import_pairs: Path | None = None
    name: str | None = None
