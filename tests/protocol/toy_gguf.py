"""A Llama GGUF of the bundled toy checkpoint, written by the tests, for ``ster model import``.

The weights are the toy's, renamed to llama.cpp's tensor names, with the query and key
rows permuted the way llama.cpp's converter does (transformers' GGUF reader undoes it).
The vocabulary is stored as a byte-level BPE one whose merges transformers derives: enough for transformers
to rebuild a tokenizer, which is all an import needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ster.engine.model.resolve import TOY_DIR

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(name: str) -> str:
    name = name.removeprefix("model.").removesuffix(".weight")
    if name == "embed_tokens":
        return "token_embd.weight"
    if name in ("norm", "lm_head"):
        return {"norm": "output_norm", "lm_head": "output"}[name] + ".weight"
    _, index, rest = name.split(".", 2)
    return f"blk.{index}.{_LAYER_NAMES[rest]}.weight"


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_toy_gguf(path: Path) -> Path:
    """Write the toy checkpoint as a Llama GGUF at ``path``."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((TOY_DIR / "config.json").read_text())
    vocab = json.loads((TOY_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("ster toy")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in sorted(vocab.items(), key=lambda item: item[1])])
    writer.add_token_scores([0.0] * len(vocab))
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    for name, tensor in sorted(load_file(str(TOY_DIR / "model.safetensors")).items()):
        if name.endswith("q_proj.weight"):
            tensor = _permute(tensor, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            tensor = _permute(tensor, config["num_key_value_heads"])
        writer.add_tensor(_gguf_name(name), np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
