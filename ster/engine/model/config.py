"""config.json: the architecture check and the decoder's hyper-parameters.

This module reads JSON only. It runs before any weight is opened, so a checkpoint of
a family Ster does not run, or one with a setting the decoder does not implement, is
refused before a byte of weights is read.

One decoder runs every family (:mod:`ster.engine.model.decoder`); what differs between
families is stated here as data: a :class:`Family` says which structural options the
family's blocks have (q/k norms, Gemma's ``1 + w`` norm weights and extra norms, the
embedding scale, biases, fused projections), and its small normalising function turns the
family's config.json spelling into the fields of one :class:`DecoderConfig` (the defaults
of the family's own ``transformers`` config class, its sliding-window layers, its rotary
bases per layer type).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error, read_json

_ROPE_TYPES = ("default", "linear", "llama3")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
"""The MLP activations the decoder implements (``hidden_act``, Gemma's ``hidden_activation``)."""
SLIDING, FULL = "sliding_attention", "full_attention"
MAX_LAYERS = 4096
"""More layers than any model has (the largest published ones have about 130): a larger count, or a steering
artifact's layer index at or past it, is a file written wrong, not a model."""
MAX_SIZE = 1 << 24
"""Above any width, vocabulary or head count a checkpoint has (the largest vocabularies are about 2^18)."""
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
"""The counts a decoder is built from: each a whole number from 1 to :data:`MAX_SIZE`."""
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim")
MAX_POSITIONS = 1 << 31
"""A context longer than any model's (the longest are about 2^23 positions)."""
POSITIVE_REALS = (
    "rms_norm_eps",
    "rope_theta",
    "rope_local_theta",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "attn_logit_softcapping",
)
"""Settings that are divided by, raised to a power or taken a root of: each a finite number above 0 (or null)."""


@dataclass(frozen=True)
class Family:
    """What one model family's decoder blocks have beyond Llama's, and how its config.json is read."""

    model_type: str
    defaults: dict[str, Any] = field(default_factory=dict)
    """Values the family's ``transformers`` config class assumes when config.json omits them."""
    qkv_bias: bool = False
    """q, k and v carry a bias whatever ``attention_bias`` says (Qwen2; the output projection has none)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head (``q_norm``, ``k_norm``) before the rotation."""
    norm_offset: float = 0.0
    """Every RMSNorm scales by ``offset + w`` (Gemma stores ``w`` and applies ``1 + w``, in f32)."""
    embed_scale: bool = False
    """Embeddings are multiplied by ``sqrt(hidden_size)`` (Gemma)."""
    sandwich_norms: bool = False
    """Norms on the attention's and the MLP's outputs too (Gemma: ``post_attention_layernorm`` is then the
    attention output's norm, ``pre_feedforward_layernorm`` the MLP input's, ``post_feedforward_layernorm`` its
    output's)."""
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A checkpoint projection that holds several of Ster's, stacked by rows in this order (Phi-3's ``qkv_proj``
    and ``gate_up_proj``). The decoder keeps the separate projections (and fuses them itself), so LoRA targets
    keep their short names; loading splits the tensor, merging folds into its rows."""
    normalise: Callable[[dict[str, Any]], None] = lambda raw: None
    """Rewrites a raw config.json (a copy) into :class:`DecoderConfig`'s fields: sliding layers, rotary bases."""
    text_config: bool = False
    """config.json describes the text model under ``text_config`` (Gemma 3's multimodal checkpoints); the
    checkpoint's other towers are not read."""
    renames: tuple[tuple[str, str | None], ...] = ()
    """Checkpoint name prefixes and what they become in the decoder (None: a tensor the decoder does not read)."""


def _no_sliding(raw: dict[str, Any]) -> None:
    raw["sliding_window"], raw["layer_types"] = None, None


def _every_layer_slides(raw: dict[str, Any]) -> None:
    """Mistral and Phi-3: one window (or none) for every layer."""
    window = raw.get("sliding_window")
    raw["layer_types"] = None if window is None else [SLIDING] * int(raw.get("num_hidden_layers") or 0)


def _qwen_sliding(raw: dict[str, Any]) -> None:
    """Qwen2 and Qwen3: a window only with ``use_sliding_window``, on the layers from ``max_window_layers`` on
    (or as ``layer_types`` lists them)."""
    window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    raw["sliding_window"] = window
    if window is None:
        raw["layer_types"] = None
    elif raw.get("layer_types") is None:
        first = int(raw.get("max_window_layers", 28))
        raw["layer_types"] = [SLIDING if i >= first else FULL for i in range(int(raw.get("num_hidden_layers") or 0))]


def _gemma3(raw: dict[str, Any]) -> None:
    """Gemma 3: ``hidden_activation``; sliding layers by ``layer_types`` (or every ``sliding_window_pattern``-th
    layer full); global rotary settings for full layers, ``rope_local_base_freq`` (default rope) for sliding ones."""
    raw["hidden_act"] = raw.pop("hidden_activation", None) or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if raw.get("sliding_window") is not None and raw.get("layer_types") is None:
        pattern = int(raw.get("sliding_window_pattern", 6))
        raw["layer_types"] = [
            SLIDING if (i + 1) % pattern else FULL for i in range(int(raw.get("num_hidden_layers") or 0))
        ]
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and (FULL in params or SLIDING in params):  # transformers 5: per layer type
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
        raw["rope_parameters"] = {"rope_theta": 1_000_000.0, **full}
        raw["rope_local_theta"] = local.get("rope_theta", 10_000.0)
        raw["rope_local_type"] = local.get("rope_type", "default")
    else:
        raw.setdefault("rope_theta", 1_000_000.0)
        raw["rope_local_theta"] = raw.get("rope_local_base_freq", 10_000.0)


GEMMA3_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "rms_norm_eps": 1e-6,
}
"""transformers' Gemma3TextConfig defaults: the text_config of a multimodal Gemma 3 checkpoint omits many."""
GEMMA3: dict[str, Any] = {
    "qk_norm": True,
    "norm_offset": 1.0,
    "embed_scale": True,
    "sandwich_norms": True,
    "normalise": _gemma3,
}

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("llama", normalise=_no_sliding),
        Family("qwen2", {"rms_norm_eps": 1e-6}, qkv_bias=True, normalise=_qwen_sliding),
        Family("mistral", {"sliding_window": 4096}, normalise=_every_layer_slides),
        Family("qwen3", {"head_dim": 128}, qk_norm=True, normalise=_qwen_sliding),
        Family(
            "phi3",
            {"rms_norm_eps": 1e-5, "sliding_window": None},
            fused={"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")},
            normalise=_every_layer_slides,
        ),
        Family("gemma3_text", GEMMA3_DEFAULTS, **GEMMA3),
        Family(
            "gemma3",
            GEMMA3_DEFAULTS,
            **GEMMA3,
            text_config=True,
            renames=(
                ("language_model.model.", "model."),
                ("language_model.lm_head.", "lm_head."),
                ("model.language_model.", "model."),
                ("vision_tower.", None),
                ("multi_modal_projector.", None),
                ("model.vision_tower.", None),
                ("model.multi_modal_projector.", None),
            ),
        ),
    )
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
FAMILY_FIELDS = (
    "sliding_window",
    "layer_types",
    "rope_local_theta",
    "rope_local_type",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "partial_rotary_factor",
    "use_bidirectional_attention",
)
"""The fields Llama does not have. A Llama config never sets them, and they are left out of its
fingerprint, which therefore stays what it was before other families ran."""


class RopeScaling(BaseModel):
    """How rotary frequencies are rescaled for long contexts (``rope_scaling``)."""

    model_config = ConfigDict(extra="ignore")
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @model_validator(mode="after")
    def _possible(self) -> RopeScaling:
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _positive_real(name, getattr(self, name))
        _size("original_max_position_embeddings", self.original_max_position_embeddings, MAX_POSITIONS)
        return self


class DecoderConfig(BaseModel):
    """The fields of a config.json that the decoder reads, whatever the family."""

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
    # Beyond Llama (FAMILY_FIELDS):
    sliding_window: int | None = None
    """How many positions a sliding layer's query sees, itself included (``q - k < window``); None: no window."""
    layer_types: list[str] | None = None
    """Per layer, ``sliding_attention`` or ``full_attention``; None when no layer slides."""
    rope_local_theta: float | None = None
    """The rotary base of sliding layers when it differs from ``rope_theta`` (Gemma 3); they get no scaling."""
    rope_local_type: str = "default"
    query_pre_attn_scalar: float | None = None
    """Attention scores are scaled by this ** -0.5 instead of head_dim ** -0.5 (Gemma)."""
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    partial_rotary_factor: float = 1.0
    """The share of each head's width that rotates (Phi-3 family); the rest passes unrotated."""
    use_bidirectional_attention: bool = False
    native: bool = True
    """False for a causal LM of a family Ster has no decoder for, which runs through transformers' own model
    (:mod:`ster.engine.model.generic`); its fields are read off transformers' config class."""
    unimplemented: str | None = None
    """What sends a model of a family Ster does have a decoder for through transformers instead (a setting that
    decoder does not implement, such as Phi-3's ``longrope``); None otherwise."""

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, raw: Any) -> Any:
        """The family's defaults and spelling first (see :class:`Family`), then both spellings of the rotary
        settings (``rope_theta``/``rope_scaling`` and the newer ``rope_parameters``) and the old ``type`` key
        inside ``rope_scaling``."""
        if not isinstance(raw, dict):
            return raw
        data = dict(raw)
        family = FAMILIES.get(str(data.get("model_type")))
        if family is not None and family.text_config:
            outer = {name: data[name] for name in ("tie_word_embeddings",) if name in data}
            data = {**outer, **(data.get("text_config") or {}), "model_type": family.model_type}
        if family is not None:
            if family.model_type == "llama":
                for name in FAMILY_FIELDS:
                    data.pop(name, None)
            for name, value in family.defaults.items():
                data.setdefault(name, value)
            family.normalise(data)
        params = data.pop("rope_parameters", None)
        if isinstance(params, dict):
            data.setdefault("rope_theta", params.get("rope_theta", 10000.0))
            if "partial_rotary_factor" in params and family is not None and family.model_type != "llama":
                data.setdefault("partial_rotary_factor", params["partial_rotary_factor"])
            if params.get("rope_type", "default") != "default":
                data.setdefault("rope_scaling", params)
        scaling = data.get("rope_scaling")
        if isinstance(scaling, dict) and "rope_type" not in scaling and "type" in scaling:
            data["rope_scaling"] = {**scaling, "rope_type": scaling["type"]}
        return data

    @model_validator(mode="after")
    def _possible(self) -> DecoderConfig:
        """Refuse values no model has (a vocabulary of -1, a NaN rotary base), which would otherwise fail deep
        inside the decoder; a check of what Ster's decoder does not implement is :func:`_check_supported`'s."""
        for name in SIZES:
            _size(name, getattr(self, name))
        for name in OPTIONAL_SIZES:
            if getattr(self, name) is not None:
                _size(name, getattr(self, name))
        _size("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS)
        for name in POSITIVE_REALS:
            if getattr(self, name) is not None:
                _positive_real(name, getattr(self, name))
        if self.num_hidden_layers > MAX_LAYERS:
            raise ValueError(
                f"num_hidden_layers {self.num_hidden_layers} is more than any model has (Ster reads at "
                f"most {MAX_LAYERS})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} does not divide into its {self.num_attention_heads} "
                "attention heads, and no head_dim says how wide a head is"
            )
        return self

    @property
    def family(self) -> Family:
        """The family's record; a model run through transformers has the plain one (nothing fused or renamed)."""
        return FAMILIES.get(self.model_type) or Family(self.model_type)

    @property
    def kv_heads(self) -> int:
        """Key/value heads; equal to the query heads when the config does not say (no GQA)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_size(self) -> int:
        """How many of a head's dimensions rotate (all but with a ``partial_rotary_factor``)."""
        return int(self.head_size * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float | None:
        """The factor of the attention scores when it is not ``head_dim ** -0.5`` (None: that default)."""
        return None if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar**-0.5

    def sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window."""
        return self.sliding_window is not None and self.layer_types is not None and self.layer_types[layer] == SLIDING

    @property
    def eos_ids(self) -> list[int]:
        """End-of-sequence ids named by config.json (possibly none)."""
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    def architecture(self) -> dict[str, Any]:
        """Every field that decides the residual stream (not the special token ids nor the context length), for
        the checkpoint fingerprint; a Llama config's is what it was before other families were read."""
        exclude = {"bos_token_id", "eos_token_id", "max_position_embeddings", "native", "unimplemented"}
        # (how a checkpoint runs — Ster's decoder or transformers' — is not what it is)
        if self.model_type == "llama":
            exclude |= set(FAMILY_FIELDS)
        return self.model_dump(mode="json", exclude=exclude)


def _size(name: str, value: int, bound: int = MAX_SIZE) -> None:
    if not 1 <= value <= bound:
        raise ValueError(f"{name} {value} is not a size a model has; it must be a whole number from 1 to {bound}")


def _positive_real(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} {value} must be a finite number above 0")


def fused_rows(config: DecoderConfig, projection: str) -> int:
    """Output rows of one of the projections a fused tensor stacks (q, k, v, gate, up)."""
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.kv_heads, "v_proj": config.kv_heads}
    return heads[projection] * config.head_size if projection in heads else config.intermediate_size


def decoder_name(config: DecoderConfig, name: str) -> str | None:
    """The decoder's name for checkpoint tensor ``name`` (its own for most families; Gemma 3's multimodal
    checkpoints hold the text model under ``language_model``), or None for a tensor the decoder does not read."""
    for prefix, replacement in config.family.renames:
        if name.startswith(prefix):
            return None if replacement is None else replacement + name[len(prefix) :]
    return name


def read_model_type(path: Path) -> str:
    """The ``model_type`` string of a config.json, refusing a file that has none."""
    raw = read_json(path, "model config")
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise Refusal(f"model config {path} declares no model_type")
    return raw["model_type"]


def check_architecture(model_type: str, where: str, supported: tuple[str, ...] = SUPPORTED_MODEL_TYPES) -> None:
    """Refuse any family but those ``supported``, naming the type found and the types supported."""
    if model_type not in supported:
        names = ", ".join(f'"{name}"' for name in supported)
        raise Refusal(
            f'{where} declares model_type "{model_type}", which Ster cannot load; supported model types: {names}'
        )


def check_model_type(path: Path, where: str | None = None) -> str:
    """A config.json's ``model_type``, refusing one Ster cannot run: a native family, or a causal language model
    transformers itself knows (run through its own model). Reads JSON only (and transformers' tables of classes)."""
    model_type = read_model_type(path)
    if model_type not in FAMILIES:
        generic_config(read_json(path, "model config"), where or str(path))
    return model_type


def generic_config(raw: dict[str, Any], where: str) -> Any:
    """transformers' own config object of a causal LM of a family Ster has no decoder for; a checkpoint that is
    not one (an encoder, an encoder-decoder, a classifier, a type transformers does not know, remote code) is
    refused in one sentence, before any weight is read."""
    model_type = str(raw.get("model_type"))
    from transformers.models.auto import configuration_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    CONFIG_MAPPING_NAMES: dict[str, str] = configuration_auto.CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        names = ", ".join(f'"{name}"' for name in SUPPORTED_MODEL_TYPES)
        raise Refusal(
            f'{where} declares model_type "{model_type}", which Ster cannot load: it has no decoder for it '
            f"(natively: {names}) and transformers does not know it"
        )
    architectures = [str(name) for name in raw.get("architectures") or []]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or raw.get("is_encoder_decoder"):
        raise Refusal(
            f'{where} declares model_type "{model_type}", which is not a causal language model; Ster reads '
            "and steers causal language models only"
        )
    if architectures and not any("CausalLM" in name or "LMHead" in name for name in architectures):
        raise Refusal(
            f"{where} declares architectures {', '.join(architectures)}, which is not a causal language "
            "model; Ster reads and steers causal language models only"
        )
    if raw.get("auto_map"):
        raise Refusal(f"{where} needs its own modelling code (auto_map); Ster does not run code a checkpoint ships")
    try:
        return CONFIG_MAPPING[model_type].from_dict(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise Refusal(f"{where} is not a usable {model_type} config: {exc}") from None


def _generic_decoder_config(raw: dict[str, Any], path: Path, unimplemented: str | None = None) -> DecoderConfig:
    """The decoder fields of a model run through transformers, read off its own config class (which knows
    each family's spelling: GPT-2's ``n_embd`` is its ``hidden_size``)."""
    return decoder_config_of(generic_config(raw, str(path)), str(raw["model_type"]), str(path), unimplemented)


def decoder_config_of(hf_config: Any, model_type: str, where: str, unimplemented: str | None = None) -> DecoderConfig:
    """The decoder fields of transformers' config object ``hf_config`` (of a checkpoint, or of a model the caller
    already holds), refused in one sentence naming ``where`` when they are not usable."""
    hf = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config

    def value(name: str, default: Any = None) -> Any:
        try:
            found = getattr(hf, name)
        except AttributeError:
            return default
        return default if found is None else found

    try:
        hidden, heads = int(value("hidden_size")), int(value("num_attention_heads", 1))
        return DecoderConfig(
            model_type=model_type,
            native=False,
            unimplemented=unimplemented,
            vocab_size=value("vocab_size"),
            hidden_size=hidden,
            intermediate_size=value("intermediate_size", None) or value("n_inner", None) or 4 * hidden,
            num_hidden_layers=value("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=value("num_key_value_heads", heads),
            head_dim=value("head_dim", hidden // heads if heads > 0 else None),
            hidden_act=str(value("hidden_act", "") or value("hidden_activation", "") or "unknown"),
            max_position_embeddings=value("max_position_embeddings", 2048),
            tie_word_embeddings=bool(value("tie_word_embeddings", False)),
            bos_token_id=value("bos_token_id"),
            eos_token_id=value("eos_token_id"),
            sliding_window=value("sliding_window"),
            layer_types=value("layer_types"),
            final_logit_softcapping=value("final_logit_softcapping"),
        )
    except (ValidationError, TypeError, ValueError) as exc:
        detail = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise Refusal(f"model config {where} is not a usable {model_type} config: {detail}") from None


def load_config(path: Path) -> DecoderConfig:
    """Read and check a config.json: the family first, then the settings the decoder needs."""
    model_type = read_model_type(path)
    if model_type not in FAMILIES:  # checked and read in one step (generic_config refuses what cannot run)
        return _generic_decoder_config(read_json(path, "model config"), path)
    try:
        config = DecoderConfig.model_validate(read_json(path, "model config"))
    except ValidationError as exc:
        raise Refusal(f"model config {path} is not a usable {model_type} config: {first_error(exc)}") from None
    _check_supported(config, path)
    unimplemented = _unimplemented(config)
    if unimplemented is not None:
        return _generic_decoder_config(read_json(path, "model config"), path, unimplemented)
    return config


def _unimplemented(config: DecoderConfig) -> str | None:
    """A setting Ster's own decoder does not implement, as a phrase; the model then runs through transformers'
    own model rather than wrongly (None: the native decoder runs it)."""
    if config.hidden_act not in ACTIVATIONS:
        return f'hidden_act "{config.hidden_act}" (Ster\'s decoder implements {", ".join(ACTIVATIONS)})'
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type not in _ROPE_TYPES:
        return f'rope scaling "{scaling.rope_type}" (Ster\'s decoder implements {", ".join(_ROPE_TYPES)})'
    if config.rope_local_type != "default":
        return f'rope type "{config.rope_local_type}" on its sliding layers'
    if config.attn_logit_softcapping is not None:
        return "attention-logit soft-capping (attn_logit_softcapping)"
    return None


def _check_supported(config: DecoderConfig, path: Path) -> None:
    """Refuse settings no decoder can run as they stand."""
    if config.num_attention_heads % config.kv_heads:
        raise Refusal(
            f"model config {path} has {config.kv_heads} key/value heads, which do not divide "
            f"its {config.num_attention_heads} attention heads"
        )
    if config.use_bidirectional_attention:
        raise Refusal(f"model config {path} uses bidirectional attention; Ster runs causal decoders only")
    if config.rotary_size % 2 or not 0 < config.partial_rotary_factor <= 1:
        raise Refusal(
            f"model config {path} has partial_rotary_factor {config.partial_rotary_factor}, which does "
            f"not rotate an even number of each head's {config.head_size} dimensions"
        )
    if config.sliding_window is not None and config.sliding_window < 1:
        raise Refusal(
            f"model config {path} has sliding_window {config.sliding_window}; a window sees at least the token itself"
        )
    types = config.layer_types
    if types is not None and (len(types) != config.num_hidden_layers or set(types) - {SLIDING, FULL}):
        raise Refusal(
            f"model config {path} has layer_types that do not give one of {SLIDING}, {FULL} for each of "
            f"its {config.num_hidden_layers} layers"
        )
