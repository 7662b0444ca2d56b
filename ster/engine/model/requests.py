"""Requests of the jobs that map a checkpoint: the shared model flags, sampling, and GGUF import."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, field_validator

from ster.engine.protocol.requests import Request, nucleus, seed, temperature

DEVICE_ALIASES = {"metal": "mps"}
"""Other spellings of a device: ``metal`` is what the original calls Apple's GPU, torch calls it ``mps``."""


def _device_alias(value: Any) -> Any:
    return DEVICE_ALIASES.get(value, value) if isinstance(value, str) else value


Precision = Literal["f32", "f16", "bf16", "int8"]
"""The dtype of the frozen base weights; ``int8`` is weight-only int8 (torchao) with f32 activations."""
Device = Annotated[Literal["cpu", "cuda", "mps", "auto"], BeforeValidator(_device_alias)]
"""Where the model runs; ``metal`` is accepted and normalised to ``mps``."""
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
    """``cpu``, ``cuda``, ``mps`` (also spelled ``metal``), or ``auto`` for the first accelerator present."""
    chat_template: ChatMode = "auto"
    """``auto`` applies the model's own chat template when it publishes one; ``off`` encodes raw text."""


class SampledRequest(ModelRequest):
    """Flags shared by the commands that generate text."""

    temperature: float = 0.0
    """0 decodes greedily; above 0 samples, seeded by ``seed``."""
    top_p: float | None = None
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    seed: int = 42
    """An unsigned 64-bit number, 0 to 2^64-1: what a torch generator takes."""

    _temperature = field_validator("temperature")(lambda cls, v: temperature(v))
    _top_p = field_validator("top_p")(lambda cls, v: nucleus(v))
    _seed = field_validator("seed")(lambda cls, v: seed(v))


class ModelImportRequest(Request):
    """``ster model import``: a GGUF file (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3) converted into a standard
    checkpoint directory."""

    directory_outputs: ClassVar[tuple[str, ...]] = ("output",)
    gguf: Path
    output: Path
