"""Tiny GGUF files written from tiny transformers models, the way a GGUF of each family lays its model out.

Written from the format's rules: tensors named ``token_embd``, ``blk.N.*``, ``output_norm`` and
``output`` (absent when the head is tied), stored at f32; a Llama file's q/k rows reordered per head so
each rotated pair is adjacent (GGML's normal rope pairs neighbours, Hugging Face's pairs the two halves
of a head); a Gemma file's norm weights stored as ``1 + w`` (Gemma's RMSNorm multiplies by ``1 + w``,
GGML's by the weight itself); the model's shape as ``{arch}.*`` metadata; a byte-level BPE vocabulary
(``tokenizer.ggml.model`` ``gpt2``) with a few merges, four control tokens and a chat template.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""A block's Hugging Face module names and the GGUF names of the same tensors."""

GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
"""Gemma 3 normalises four times a block: its attention output and MLP output too."""

TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}

SPECIALS = ("<s>", "</s>", "<pad>", "<end_of_turn>")
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ r", "i v", "Ġr iv", "e r", "Ġriv er", "Ġ s", "e a", "Ġs ea")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE spells bytes with, in byte order (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return [spelling[byte] for byte in range(256)]


def vocabulary() -> list[str]:
    """Tokens in id order: the specials (ids 0-3), the 256 bytes, then one token per merge."""
    return [*SPECIALS, *byte_alphabet(), *(merge.replace(" ", "") for merge in MERGES)]


VOCAB_SIZE = len(vocabulary())
BOS, EOS, PAD, END_OF_TURN = 0, 1, 2, 3


def permute_for_normal_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """Reorder each head's rows from halves ``[x0..x(d/2-1), y0..y(d/2-1)]`` to pairs ``[x0, y0, x1, y1, …]``."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(model: Any, architecture: str) -> dict[str, np.ndarray]:
    """The model's state dict under GGUF names, with the family's value and layout conventions applied."""
    config = model.config
    names = GEMMA_LAYER_NAMES if architecture == "gemma3" else LAYER_NAMES
    tensors = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        module, suffix = hf_name.rsplit(".", 1)
        array = tensor.detach().float().numpy().copy()
        if architecture == "gemma3" and module.endswith("norm"):
            array = array + 1.0
        if architecture == "llama" and module.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            array = permute_for_normal_rope(array, heads)
        tensors[f"{_gguf_module(module, names)}.{suffix}"] = array
    return tensors


def _gguf_module(module: str, names: dict[str, str]) -> str:
    if module in TOP_NAMES:
        return TOP_NAMES[module]
    _, _, layer, rest = module.split(".", 3)  # model.layers.N.<rest>
    return f"blk.{layer}.{names[rest]}"


def write_gguf(
    path: Path,
    model: Any,
    architecture: str,
    *,
    name: str = "tiny",
    drop: Iterable[str] = (),
    tensors: dict[str, np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
    tokenizer_model: str = "gpt2",
) -> Path:
    """Write ``model`` as a GGUF of ``architecture``; ``drop`` leaves tensors out, ``tensors`` adds or replaces
    some, ``metadata`` adds or replaces ``{arch}.*`` keys (a value of None removes one), ``tokenizer_model`` names
    another kind of vocabulary than byte-level BPE."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    keys = {**_shape_metadata(model.config, architecture), **(metadata or {})}
    for key, value in keys.items():
        if value is not None:
            _add_value(writer, f"{architecture}.{key}", value)
    _add_tokenizer(writer, tokenizer_model)
    for tensor_name, array in {**gguf_tensors(model, architecture), **(tensors or {})}.items():
        if tensor_name not in drop:
            writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _shape_metadata(config: Any, architecture: str) -> dict[str, Any]:
    """What a GGUF states of the model's shape, under its ``{arch}.`` prefix."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    if architecture == "gemma3":
        rope = rope.get("full_attention", rope)
    keys = {
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "block_count": config.num_hidden_layers,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.freq_base": float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        "rope.dimension_count": int(
            head_dim * rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        ),
    }
    if getattr(config, "sliding_window", None) is not None and architecture == "gemma3":
        keys["attention.sliding_window"] = config.sliding_window
    if rope.get("rope_type", "default") == "linear":
        keys["rope.scaling.type"], keys["rope.scaling.factor"] = "linear", float(rope["factor"])
    return keys


def _add_value(writer: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_string(key, str(value))


def _add_tokenizer(writer: Any, model: str) -> None:
    import gguf

    tokens = vocabulary()
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control if token in SPECIALS else normal for token in tokens])
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_pad_token_id(PAD)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}
FAMILIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    # Llama: a head width that is not hidden / heads, biases on the attention and the MLP, linear rope scaling.
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        "llama",
        {
            "head_dim": 16,
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
        },
    ),
    # Mistral: written as a llama GGUF, as llama.cpp writes it (no window: a GGUF of it states none).
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        "llama",
        {"head_dim": 16, "sliding_window": None, "tie_word_embeddings": False},
    ),
    # Qwen2: biases on q, k and v, a tied head (no output.weight in the file).
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen2", {"tie_word_embeddings": True, "rope_theta": 5000.0}),
    # Qwen3: q/k norms, biases on all four attention projections, a head width other than the class's 128.
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "qwen3",
        {"head_dim": 16, "attention_bias": True, "tie_word_embeddings": False},
    ),
    # Phi-3: fused qkv and gate/up tensors, half of each head rotating.
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        "phi3",
        {"partial_rotary_factor": 0.5, "sliding_window": None, "tie_word_embeddings": False},
    ),
    # Gemma 3: 1 + w norms (four a block, q/k too), six layers so the sixth is full and the rest slide (window 5),
    # linear scaling on the full layer's rope, the score scale at llama.cpp's 1/sqrt(head_dim), a tied head.
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "gemma3",
        {
            "num_hidden_layers": 6,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 5,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "tie_word_embeddings": True,
        },
    ),
}
"""Per family: transformers' config and model classes, the GGUF architecture, the family's distinctive options."""


def tiny_model(family: str) -> Any:
    """A tiny transformers model of ``family``, every tensor random (norms and biases too), f32, eager attention."""
    import torch
    import transformers

    config_class, model_class, _, options = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**COMMON, **options})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") and family != "gemma3" else 0.0
            param.copy_(base + torch.randn(param.shape) * (0.5 if "embed" in name else 0.1))
    return model


def write_family_gguf(directory: Path, family: str, **options: Any) -> tuple[Path, Any]:
    """Build ``family``'s tiny model and write it as ``directory/<family>.gguf`` (``options`` as :func:`write_gguf`
    takes them); return the path and the model."""
    model = tiny_model(family)
    options.setdefault("name", f"{family.capitalize()} tiny")
    return write_gguf(directory / f"{family}.gguf", model, FAMILIES[family][2], **options), model
