"""config.json: the architecture check and the decoder's hyper-parameters.

This module reads JSON only. It runs before any weight is opened, so a checkpoint of
the wrong family, or a Llama checkpoint with a setting the decoder does not
implement, is refused before a byte of weights is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error, read_json

SUPPORTED_MODEL_TYPES = ("llama",)
_ROPE_TYPES = ("default", "linear", "llama3")


class RopeScaling(BaseModel):
    """How rotary frequencies are rescaled for long contexts (``rope_scaling``)."""

    model_config = ConfigDict(extra="ignore")
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class LlamaConfig(BaseModel):
    """The fields of a Llama config.json that the decoder reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_rope_parameters(cls, raw: Any) -> Any:
        """Accept both spellings of the rotary settings (``rope_theta``/``rope_scaling`` and
        the newer ``rope_parameters``) and the old ``type`` key inside ``rope_scaling``."""
        if not isinstance(raw, dict):
            return raw
        data = dict(raw)
        params = data.pop("rope_parameters", None)
        if isinstance(params, dict):
            data.setdefault("rope_theta", params.get("rope_theta", 10000.0))
            if params.get("rope_type", "default") != "default":
                data.setdefault("rope_scaling", params)
        scaling = data.get("rope_scaling")
        if isinstance(scaling, dict) and "rope_type" not in scaling and "type" in scaling:
            data["rope_scaling"] = {**scaling, "rope_type": scaling["type"]}
        return data

    @property
    def kv_heads(self) -> int:
        """Key/value heads; equal to the query heads when the config does not say (no GQA)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def eos_ids(self) -> list[int]:
        """End-of-sequence ids named by config.json (possibly none)."""
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)


def read_model_type(path: Path) -> str:
    """The ``model_type`` string of a config.json, refusing a file that has none."""
    raw = read_json(path, "model config")
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise Refusal(f"model config {path} declares no model_type")
    return raw["model_type"]


def check_architecture(model_type: str, where: str) -> None:
    """Refuse any family but Llama, naming the type found and the types supported."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(f'"{name}"' for name in SUPPORTED_MODEL_TYPES)
        raise Refusal(
            f'{where} declares model_type "{model_type}", which Ster cannot load; '
            f"supported model types: {supported}"
        )


def load_config(path: Path) -> LlamaConfig:
    """Read and check a config.json: the family first, then the settings the decoder needs."""
    check_architecture(read_model_type(path), str(path))
    try:
        config = LlamaConfig.model_validate(read_json(path, "model config"))
    except ValidationError as exc:
        raise Refusal(f"model config {path} is not a usable Llama config: {first_error(exc)}") from None
    _check_supported(config, path)
    return config


def _check_supported(config: LlamaConfig, path: Path) -> None:
    """Refuse the Llama settings this decoder does not implement, rather than run them wrongly."""
    if config.hidden_act != "silu":
        raise Refusal(f'model config {path} uses hidden_act "{config.hidden_act}"; Ster implements silu only')
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type not in _ROPE_TYPES:
        raise Refusal(
            f'model config {path} uses rope scaling "{scaling.rope_type}"; '
            f"Ster implements {', '.join(_ROPE_TYPES)}"
        )
    if config.num_attention_heads % config.kv_heads:
        raise Refusal(f"model config {path} has {config.kv_heads} key/value heads, which do not divide "
                      f"its {config.num_attention_heads} attention heads")
