"""Job requests: one pydantic model per job, its fields mirroring the command's flags.

The CLI builds these from parsed flags and the TUI from its forms; a job receives a
validated request and nothing else. Field constraints refuse bad values in one
sentence each (see :func:`build_request`). Nothing here imports torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ster.engine.errors import Refusal
from ster.engine.layers import LayerSpec
from ster.engine.pairs.model import PairSet

Precision = Literal["f32", "f16", "bf16"]
Device = Literal["cpu", "cuda", "mps", "auto"]
ChatMode = Literal["auto", "off"]

R = TypeVar("R", bound=BaseModel)


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelRequest(_Request):
    """The flags every command that maps a checkpoint shares."""

    model: str
    """A local checkpoint directory, a Hugging Face Hub id, or a reserved name such as ``ster:toy``."""
    revision: str | None = None
    """A Hub branch, tag or commit; the resolved commit is what artifacts record."""
    precision: Precision = "f32"
    """The dtype the frozen base weights are held at."""
    device: Device = "cpu"
    chat_template: ChatMode = "auto"
    """``auto`` applies the model's own chat template when it publishes one; ``off`` encodes raw text."""


class _Sampled(ModelRequest):
    """Flags shared by the commands that generate text."""

    temperature: float = 0.0
    """0 decodes greedily; above 0 samples, seeded by ``seed``."""
    top_p: float | None = None
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    seed: int = 42

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise ValueError("--temperature must be a finite number of at least 0")
        return value

    _top_p = field_validator("top_p")(lambda cls, v: _nucleus(v))


class GenerateRequest(_Sampled):
    """``ster generate``: autoregressive decoding from one prompt, steered when given a vector."""

    prompt: str
    vector: Path | None = None
    """A steering artifact; without one the run is the unsteered baseline."""
    strength: float = 1.0
    """Multiplier of every direction in the artifact; negative steers the other way."""
    max_new_tokens: int = 128

    _tokens = field_validator("max_new_tokens")(lambda cls, v: _at_least_one(v, "--max-new-tokens"))
    _strength = field_validator("strength")(lambda cls, v: _finite(v, "--strength"))


class _LayeredRead(ModelRequest):
    """A read at selected layers, in batches, that writes one document."""

    output: Path
    layers: str = "all"
    batch_size: int = 8
    """Sequences (prompts, or pairs) read per forward pass; results equal one-at-a-time reads."""

    _layers = field_validator("layers")(lambda cls, v: _layer_spec(v))
    _batch = field_validator("batch_size")(lambda cls, v: _at_least_one(v, "--batch-size"))


class ExtractRequest(_LayeredRead):
    """``ster extract``: last-token residual states after selected blocks, for a prompt set."""

    input: Path
    """A JSON document ``{"prompts": ["...", ...]}``."""


class OptimizeRequest(_LayeredRead):
    """``ster optimize``: every method at every selected layer ranked on an ordered holdout."""

    pairs: Path | None = None
    """The pair set; the workspace's active set when omitted."""


class TrainRequest(OptimizeRequest):
    """``ster train``: one direction per selected layer, written as a steering artifact."""

    method: Literal["caa", "pca", "logistic"] = "caa"


class EvaluateRequest(ModelRequest):
    """``ster evaluate``: an artifact's accuracy and margin on a pair set."""

    pairs: Path | None = None
    """The pair set; the workspace's active set when omitted."""
    vector: Path
    batch_size: int = 8

    _batch = field_validator("batch_size")(lambda cls, v: _at_least_one(v, "--batch-size"))


class SweepRequest(_Sampled):
    """``ster sweep``: steered text, effect and degeneracy at each strength."""

    vector: Path
    prompts: Path | None = None
    """A JSON document ``{"prompts": [...]}``."""
    prompt_texts: list[str] | None = None
    """The prompts themselves, instead of a file (exactly one of the two)."""
    strengths: list[float]
    max_new_tokens: int = 48

    _tokens = field_validator("max_new_tokens")(lambda cls, v: _at_least_one(v, "--max-new-tokens"))

    @field_validator("strengths")
    @classmethod
    def _strengths(cls, values: list[float]) -> list[float]:
        if not values:
            raise ValueError("--strengths needs at least one strength")
        for value in values:
            _finite(value, "--strengths")
        return sorted(set(values) | {0.0})


class PairsInspectRequest(_Request):
    """``ster pairs inspect``: duplicates, refusals, balance and diversity of a pair set; no model."""

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

    _bits = field_validator("dedupe_bits")(lambda cls, v: _between(v, 0, 63, "--dedupe-bits"))
    _bands = field_validator("dedupe_bands")(lambda cls, v: _between(v, 1, 64, "--dedupe-bands"))
    _threshold = field_validator("refusal_threshold")(lambda cls, v: _finite(v, "--refusal-threshold"))


class PairsAddRequest(_Request):
    """``ster pairs add``: append one pair, creating the file and its directory when missing."""

    pairs: Path
    positive: str
    negative: str
    trait: str | None = None
    """Sets or replaces the set's trait name."""


class PairsSaveRequest(_Request):
    """Write a whole pair set (the TUI's editor saving), validated first, atomically."""

    pairs: Path
    pair_set: PairSet


class PairsRemoveRequest(_Request):
    """``ster pairs remove``: drop the pair at a zero-based index."""

    pairs: Path
    index: int


class PairsSynthesizeRequest(_Request):
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

    _count = field_validator("count")(lambda cls, v: _at_least_one(v, "--count"))
    _retries = field_validator("retry_multiplier")(lambda cls, v: _at_least_one(v, "--retry-multiplier"))
    _tokens = field_validator("max_new_tokens")(lambda cls, v: _at_least_one(v, "--max-new-tokens"))
    _bits = field_validator("dedupe_bits")(lambda cls, v: _between(v, 0, 63, "--dedupe-bits"))
    _bands = field_validator("dedupe_bands")(lambda cls, v: _between(v, 1, 64, "--dedupe-bands"))
    _top_p = field_validator("top_p")(lambda cls, v: _nucleus(v))


class WorkspaceImportRequest(_Request):
    """``ster workspace import-pairs``: keep a canonical copy of a pair set and make it active."""

    source: Path
    name: str | None = None
    """The id of the copy; the file name (without .json) when omitted."""


class WorkspaceShowRequest(_Request):
    """``ster workspace show``: the imported sets and which one is active."""


class WorkspaceSelectRequest(_Request):
    """``ster workspace select``: make an imported set the active one."""

    id: str


class WorkspaceRemoveRequest(_Request):
    """``ster workspace remove``: forget an imported set and delete its copy."""

    id: str


class OnboardingRequest(_Request):
    """``ster onboarding``: the first-use walkthrough, replayed or started over."""

    reset: bool = False
    import_pairs: Path | None = None
    name: str | None = None


class InspectRequest(_Request):
    """``ster inspect``: validate and summarise an artifact without loading a model."""

    artifact: Path


class ModelImportRequest(_Request):
    """``ster model import``: a Llama GGUF file converted into a standard checkpoint directory."""

    gguf: Path
    output: Path


def _at_least_one(value: int, flag: str) -> int:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1")
    return value


def _nucleus(value: float | None) -> float | None:
    if value is not None and not (0 < value <= 1):
        raise ValueError("--top-p must be above 0 and at most 1")
    return value


def _between(value: int, low: int, high: int, flag: str) -> int:
    if not low <= value <= high:
        raise ValueError(f"{flag} must be between {low} and {high}")
    return value


def _finite(value: float, flag: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number")
    return value


def _layer_spec(value: str) -> str:
    try:
        LayerSpec.parse(value)
    except Refusal as exc:
        raise ValueError(str(exc)) from None
    return value


def build_request(kind: type[R], /, **fields: Any) -> R:
    """Validate a request, refusing the first bad field in one sentence."""
    try:
        return kind.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] != "value_error":
            flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "a field"
            message = f"{flag}: {message}"
        raise Refusal(message) from None
