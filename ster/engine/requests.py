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


class GenerateRequest(ModelRequest):
    """``ster generate``: autoregressive decoding from one prompt."""

    prompt: str
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 decodes greedily; above 0 samples, seeded by ``seed``."""
    top_p: float | None = None
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    seed: int = 42

    @field_validator("max_new_tokens")
    @classmethod
    def _positive_tokens(cls, value: int) -> int:
        if value < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        return value

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise ValueError("--temperature must be a finite number of at least 0")
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        if value is not None and not (0 < value <= 1):
            raise ValueError("--top-p must be above 0 and at most 1")
        return value


class ExtractRequest(ModelRequest):
    """``ster extract``: last-token residual states after selected blocks, for a prompt set."""

    input: Path
    """A JSON document ``{"prompts": ["...", ...]}``."""
    output: Path
    layers: str = "all"
    batch_size: int = 8
    """Prompts read per forward pass; results equal one-at-a-time reads."""

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: str) -> str:
        try:
            LayerSpec.parse(value)
        except Refusal as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, value: int) -> int:
        if value < 1:
            raise ValueError("--batch-size must be at least 1")
        return value


class ModelImportRequest(_Request):
    """``ster model import``: a Llama GGUF file converted into a standard checkpoint directory."""

    gguf: Path
    output: Path


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
