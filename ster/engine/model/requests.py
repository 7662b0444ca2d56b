"""Requests of the jobs that map a checkpoint: the shared model flags, sampling, and GGUF import."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import field_validator

from ster.engine.protocol.requests import Request, nucleus

Precision = Literal["f32", "f16", "bf16"]
Device = Literal["cpu", "cuda", "mps", "auto"]
ChatMode = Literal["auto", "off"]


class ModelRequest(Request):
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


class SampledRequest(ModelRequest):
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

    _top_p = field_validator("top_p")(lambda cls, v: nucleus(v))


class ModelImportRequest(Request):
    """``ster model import``: a Llama GGUF file converted into a standard checkpoint directory."""

    gguf: Path
    output: Path
