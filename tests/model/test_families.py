"""The native decoder on every family beside Llama, against ``transformers``' own implementation.

For each family a tiny checkpoint is built with transformers' config and model classes (three
layers, small widths, random weights, norms and biases included, so that every option counts),
with the family's distinctive options on: a sliding window shorter than the test sequences, q/k
norms, biases, a fused projection, tied or untied embeddings. It is saved with ``save_pretrained``
beside the toy's tokenizer, loaded by Ster like any checkpoint, and Ster's logits and per-block
hidden states must equal transformers' at f32, one sequence at a time and batched with padding.
Steering, a fresh adapter and a merged adapter must behave on it as they do on Llama.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ster.cli import main
from ster.engine.model.adapters.lora import Adapter, attached, folded, load_adapter
from ster.engine.model.config import load_config
from ster.engine.model.hooks import record_blocks
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.steering.apply import steer
from tests.tune.adapter_files import write_adapter

TOLERANCE = 1e-4
COMMON = {
    "vocab_size": 104,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
}
FAMILIES = {
    # Qwen2: biases on q, k and v (none on o); a window of 5 on the layers from 1 on, untied head.
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "use_sliding_window": True,
            "sliding_window": 5,
            "max_window_layers": 1,
            "tie_word_embeddings": False,
            "rope_theta": 5000.0,
        },
    ),
    # Mistral: every layer slides, a head width that is not hidden / heads, tied head.
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        {"sliding_window": 5, "head_dim": 16, "tie_word_embeddings": True},
    ),
    # Qwen3: q/k norms, biases on all four attention projections, a window from layer 2 on.
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {
            "head_dim": 16,
            "attention_bias": True,
            "use_sliding_window": True,
            "sliding_window": 5,
            "max_window_layers": 2,
            "tie_word_embeddings": False,
        },
    ),
    # Phi-3: fused qkv_proj and gate_up_proj, half of each head rotating, every layer slides.
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {"sliding_window": 5, "partial_rotary_factor": 0.5, "tie_word_embeddings": False},
    ),
    # Gemma 3: 1 + w norms, four norms a block, q/k norms, scaled embeddings, gelu, sliding and full layers
    # with their own rotary bases (linear scaling on the full ones), query_pre_attn_scalar, logit soft-capping.
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 5,
            "query_pre_attn_scalar": 20,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
            "final_logit_softcapping": 5.0,
            "tie_word_embeddings": True,
        },
    ),
    # Gemma 3's multimodal checkpoint: the text model under text_config and language_model.*, a vision tower
    # beside it that Ster does not read.
    "gemma3": (
        "Gemma3Config",
        "Gemma3ForConditionalGeneration",
        {
            "text_config": {
                **COMMON,
                "head_dim": 16,
                "sliding_window": 5,
                "query_pre_attn_scalar": 24,
                "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
            },
            "vision_config": {
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "image_size": 28,
                "patch_size": 14,
            },
            "mm_tokens_per_image": 4,
            "image_token_index": 100,
            "boi_token_index": 101,
            "eoi_token_index": 102,
        },
    ),
    # Gemma 2, which Ster has no decoder for (attention-logit soft-capping): transformers' own model, read and
    # steered through hooks on its layers (ster/engine/model/generic.py). Sliding and full layers, window 5.
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 5,
            "query_pre_attn_scalar": 20,
            "attn_logit_softcapping": 30.0,
            "final_logit_softcapping": 5.0,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    # Phi-3 with long-context rope ("longrope"), which Ster's decoder does not implement: the family's own
    # transformers model instead, LoRA on the pieces of its fused qkv_proj and gate_up_proj.
    "phi3_longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "sliding_window": 5,
            "original_max_position_embeddings": 32,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            },
        },
    ),
}
GENERIC = ("gemma2", "phi3_longrope")
"""The families above that run through transformers rather than Ster's own decoder."""
ROWS = [[1, 14, 20, 33, 41, 52, 60, 71, 80, 90, 17], [1, 22, 35, 47], [1, 5, 9, 13, 17, 21, 25, 29]]
"""Three sequences, two longer than every window."""


def build(family: str, where: Path) -> tuple[Path, torch.nn.Module]:
    import transformers

    config_class, model_class, options = FAMILIES[family]
    config = getattr(transformers, config_class)(**({} if "text_config" in options else COMMON), **options)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).float().eval()
    with torch.no_grad():  # every tensor random, norms and biases included, so that none goes unchecked
        for name, param in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") and not family.startswith("gemma") else 0.0
            param.copy_(base + torch.randn(param.shape) * (0.5 if "embed" in name else 0.1))
    model.config._attn_implementation = "eager"
    model.save_pretrained(where)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOY_DIR / name, where / name)
    return where, model


@pytest.fixture(scope="session", params=list(FAMILIES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(family, checkpoint directory, transformers' model, Ster's decoder) for each family, built once."""
    path, reference = build(request.param, tmp_path_factory.mktemp(request.param))
    source = resolve_model(str(path))
    config = load_config(source.config)
    return request.param, path, reference, load_decoder(source, config, "f32", torch.device("cpu"))


def ster_states(decoder, ids: torch.Tensor, key_mask: torch.Tensor | None = None):
    layers = list(range(len(decoder.blocks)))
    with torch.inference_mode(), record_blocks(decoder, layers) as seen:
        logits = decoder(ids, key_mask=key_mask, vocab="all").logits
    return logits, [seen[layer] for layer in layers]


def hf_blocks(model: torch.nn.Module, row: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers' logits [T, V] and every block's own output [T, D] (read by hooks: HF's last hidden state
    comes after the final norm)."""
    outputs: list[torch.Tensor] = []
    handles = [
        layer.register_forward_hook(lambda m, a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
        for layer in text_layers(model)
    ]
    try:
        with torch.no_grad():
            result = model(torch.tensor([row]), output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    blocks = [out[0] for out in outputs]
    for layer, hidden in enumerate(result.hidden_states[1:-1]):  # HF's own hidden states agree with the hooks
        assert torch.equal(hidden[0], blocks[layer])
    return result.logits[0], blocks


def text_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """transformers' decoder layers, in a causal LM or in a multimodal model's language model."""
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= TOLERANCE


def test_logits_and_block_outputs_equal_transformers_one_sequence_at_a_time(checkpoint) -> None:
    _, _, reference, decoder = checkpoint
    for row in ROWS:
        logits, blocks = hf_blocks(reference, row)
        ours, our_blocks = ster_states(decoder, torch.tensor([row]))
        close(ours[0], logits)
        for mine, theirs in zip(our_blocks, blocks, strict=True):
            close(mine[0], theirs)


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_equals_transformers_on_each_sequence(checkpoint, side: str) -> None:
    _, _, reference, decoder = checkpoint
    width = max(map(len, ROWS))
    ids = torch.full((len(ROWS), width), 3)
    key_mask = torch.zeros(len(ROWS), width, dtype=torch.bool)
    spans = []
    for i, row in enumerate(ROWS):
        start = 0 if side == "right" else width - len(row)
        ids[i, start : start + len(row)] = torch.tensor(row)
        key_mask[i, start : start + len(row)] = True
        spans.append(slice(start, start + len(row)))
    logits, blocks = ster_states(decoder, ids, key_mask)
    for i, row in enumerate(ROWS):
        want_logits, want_blocks = hf_blocks(reference, row)
        close(logits[i, spans[i]], want_logits)
        for mine, theirs in zip(blocks, want_blocks, strict=True):
            close(mine[i, spans[i]], theirs)


def test_decoding_with_the_cache_equals_transformers_past_the_window(checkpoint) -> None:
    """A prefill then one token at a time: the cached steps see the window as the full forward does."""
    _, _, reference, decoder = checkpoint
    row = ROWS[0]
    want, _ = hf_blocks(reference, row)
    cache = decoder.new_cache(1, len(row))
    with torch.inference_mode():
        steps = [decoder(torch.tensor([row[:3]]), cache=cache, vocab="last").logits]
        steps += [decoder(torch.tensor([[token]]), cache=cache, vocab="last").logits for token in row[3:]]
    for position, logits in zip(range(2, len(row)), steps, strict=True):
        close(logits[0], want[position])


def test_packed_pair_reads_equal_transformers(checkpoint) -> None:
    """extract's packed rows (a shared prefix once, then each side, with explicit positions and mask) slide their
    windows over positions: each side's last state equals transformers' on the side alone."""
    from ster.engine.steering.activations import read_pair_states

    _, _, reference, decoder = checkpoint
    pairs = [(ROWS[0], ROWS[0][:6] + [50, 51, 52, 53, 54]), (ROWS[2], ROWS[1])]
    positives, negatives = read_pair_states(decoder, pairs, [0, 1, 2], batch_size=2)
    for i, pair in enumerate(pairs):
        for states, row in zip((positives, negatives), pair):
            _, blocks = hf_blocks(reference, row)
            for layer in range(3):
                close(states[i, layer], blocks[layer][-1])


def test_steering_adds_at_the_block_output(checkpoint) -> None:
    _, _, _, decoder = checkpoint
    ids = torch.tensor([ROWS[0]])
    base_logits, base = ster_states(decoder, ids)
    width = decoder.config.hidden_size
    with steer(decoder, {0: torch.zeros(width)}):
        logits, blocks = ster_states(decoder, ids)
    assert torch.equal(logits, base_logits) and all(torch.equal(a, b) for a, b in zip(blocks, base))
    vector = torch.randn(width, generator=torch.Generator().manual_seed(1))
    with steer(decoder, {0: vector}):
        logits, blocks = ster_states(decoder, ids)
    assert torch.allclose(blocks[0], base[0] + vector)  # what the next block reads is the steered state
    assert all((blocks[i] - base[i]).abs().max() > 1e-3 for i in (1, 2))
    assert (logits - base_logits).abs().max() > 1e-3


TARGETS = ["query", "key", "value", "output", "gate", "up", "down"]


def test_a_fresh_adapter_is_the_identity(checkpoint) -> None:
    _, _, _, decoder = checkpoint
    ids = torch.tensor([ROWS[0]])
    base_logits, base = ster_states(decoder, ids)
    adapter = Adapter.fresh(decoder.config, 2, 4.0, TARGETS, [0, 1, 2], 0, torch.device("cpu"))
    with attached(decoder, adapter):
        logits, blocks = ster_states(decoder, ids)
    assert torch.equal(logits, base_logits) and all(torch.equal(a, b) for a, b in zip(blocks, base))


def test_a_merged_adapter_equals_the_attached_one(checkpoint, tmp_path: Path) -> None:
    """Folded into the loaded decoder and merged into a checkpoint by ``tune merge``, every target adapted."""
    _, path, _, decoder = checkpoint
    adapter_path = tmp_path / "adapter.safetensors"
    write_adapter(
        adapter_path, model=str(path), rank=2, alpha=4.0, targets=tuple(TARGETS), layers=(0, 1, 2), b_scale=0.2
    )
    _, adapter = load_adapter(adapter_path, decoder.config, torch.device("cpu"))
    ids = torch.tensor([ROWS[0]])
    base_logits, _ = ster_states(decoder, ids)
    with attached(decoder, adapter):
        adapted, _ = ster_states(decoder, ids)
        with folded(decoder):
            fold, _ = ster_states(decoder, ids)
    assert (adapted - base_logits).abs().max() > 1e-2
    close(fold, adapted)
    merged = tmp_path / "merged"
    assert main(["tune", "merge", "--model", str(path), "--adapter", str(adapter_path), "--output", str(merged)]) == 0
    source = resolve_model(str(merged))
    merged_decoder = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    logits, _ = ster_states(merged_decoder, ids)
    close(logits, adapted)


def test_settings_the_decoder_does_not_implement_send_the_model_through_transformers(cli, tmp_path: Path) -> None:
    """Read from config.json alone: the model runs through transformers' own model rather than wrongly, and the
    progress stream says why."""
    config = {**COMMON, "model_type": "gemma3_text", "attn_logit_softcapping": 50.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_config(tmp_path / "config.json")
    assert (loaded.native, loaded.unimplemented) == (False, "attention-logit soft-capping (attn_logit_softcapping)")
    config = {
        **COMMON,
        "model_type": "phi3",
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [1.0] * 6},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_config(tmp_path / "config.json")
    assert not loaded.native and loaded.unimplemented.startswith('rope scaling "longrope"')
    assert load_config(TOY_DIR / "config.json").native


def test_the_family_a_model_runs_through_is_said_once(cli, checkpoint) -> None:
    family, path, _, decoder = checkpoint
    run = cli("generate", "--model", path, "--prompt", "the sea is", "--max-new-tokens", "2")
    assert run.code == 0, run.err
    assert run.err.count("runs through transformers' model") == (1 if family in GENERIC else 0)
    if family == "phi3_longrope":
        assert 'it uses rope scaling "longrope"' in run.err
