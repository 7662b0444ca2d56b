"""``--precision int8``: weight-only int8 (torchao) for the frozen base, on the toy.

Each check compares int8 against the same run at f32 on the same checkpoint, within a
tolerance that per-row int8 weights allow; the quantization itself is checked against an
independent rounding of the f32 weights.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ster.commands import PRECISIONS
from ster.engine.model.adapters.lora import Adapter, attached
from ster.engine.model.config import load_config
from ster.engine.model.decoder import KVCache
from ster.engine.model.kernels import PLAIN, matmul
from ster.engine.model.loading import DTYPES, load_decoder
from ster.engine.model.quantize import int8_tensor_type, quantized_embedding
from ster.engine.model.requests import Precision
from ster.engine.model.resolve import resolve_model

TOY = ["--model", "ster:toy"]
IDS = torch.tensor([[1, 55, 18, 54, 32, 8, 40, 12]])
TARGETS = ["query", "key", "value", "output", "gate", "up", "down"]


def _toy(precision: str):
    source = resolve_model("ster:toy", None)
    return load_decoder(source, load_config(source.config), precision, torch.device("cpu"))


@pytest.fixture(scope="module")
def pair():
    return _toy("f32"), _toy("int8")


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_int8_is_a_precision_everywhere_one_is_named(cli) -> None:
    assert "int8" in PRECISIONS and "int8" in typing.get_args(Precision)
    assert DTYPES["int8"] == "float32"  # activations, norms and the KV cache
    assert "{f32,f16,bf16,int8}" in " ".join(cli("generate", "--help").out.split())


def test_every_projection_the_head_and_the_embedding_are_per_row_int8(pair) -> None:
    full, quantized = pair
    Int8Tensor = int8_tensor_type()
    for name, weight in quantized.state_dict().items():
        reference = full.state_dict()[name]
        if weight.ndim == 1:  # norms stay f32
            assert type(weight) in PLAIN and weight.dtype == torch.float32 and torch.equal(weight, reference)
            continue
        assert isinstance(weight, Int8Tensor) and weight.qdata.dtype == torch.int8, name
        # independently: symmetric per-row rounding with scale max|w| / 127
        scale = reference.abs().amax(dim=1, keepdim=True) / 127
        expected = torch.clamp(torch.round(reference / scale), -128, 127)
        assert (weight.qdata.float() - expected).abs().max() <= 1, name
        assert (weight.dequantize() - reference).abs().max() <= scale.max() * 0.51, name
    # the toy's head is its own tensor (SmolLM2 ties it: then the head is the embedding, quantized once)
    assert not quantized.config.tie_word_embeddings
    # fused projections are views of one tensor
    attention = quantized.blocks[0].self_attn
    assert (
        attention.k_proj.weight.qdata.data_ptr()
        == attention.fused_weight.qdata[attention.q_proj.out_features :].data_ptr()
    )


def test_the_scales_are_bf16_numbers_so_the_kernel_takes_them_unrounded(pair) -> None:
    _, quantized = pair
    for name, weight in quantized.state_dict().items():
        if weight.ndim == 2:
            assert torch.equal(weight.scale, weight.scale.to(torch.bfloat16).float()), name


def test_a_few_rows_run_on_the_int8_kernel_each_as_if_alone(pair) -> None:
    _, quantized = pair
    weight = quantized.blocks[1].mlp.fused_weight
    x = torch.randn(9, 1, weight.shape[1], generator=torch.Generator().manual_seed(0))
    dequantized = weight.dequantize()
    with torch.inference_mode():
        alone = [matmul(x[i : i + 1], weight, None) for i in range(9)]  # aten._weight_int8pack_mm (the default)
        for rows in (2, 8):
            together = matmul(x[:rows], weight, None)
            assert together.dtype == torch.float32
            for i in range(rows):
                assert torch.equal(together[i], alone[i][0]), (rows, i)
        # independently: bf16 input times the dequantized weight in f32, the product rounded to bf16 once
        for i in range(9):
            exact = F.linear(x[i].to(torch.bfloat16).float(), dequantized)
            assert torch.allclose(alone[i][0], exact, rtol=2**-8, atol=1e-6), i
        nine = matmul(x, weight, None)  # more rows than the kernel takes: torchao's f32 path
        assert torch.allclose(nine, F.linear(x, dequantized), atol=1e-5)


def test_the_embedding_reads_only_the_asked_rows_dequantized(pair) -> None:
    _, quantized = pair
    table = quantized.model.embed_tokens.weight
    assert torch.equal(quantized_embedding(IDS, table), table.dequantize()[IDS])


def test_int8_logits_and_greedy_tokens_follow_f32(pair) -> None:
    full, quantized = pair
    with torch.inference_mode():
        a = full(IDS, vocab="all").logits
        b = quantized(IDS, vocab="all").logits
    assert b.dtype == torch.float32 and _relative(b, a) < 0.05
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert F.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="batchmean") < 0.01
    # a decode step (one row, the int8 kernel) against the same step at f32
    steps = []
    for model in (full, quantized):
        with torch.inference_mode():
            cache = KVCache(model.config, 1, 16, model.lm_head.weight.dtype, torch.device("cpu"))
            model(IDS, cache=cache)
            steps.append(model(torch.tensor([[7]]), cache=cache).logits)
    assert cache.keys.dtype == torch.float32
    assert _relative(steps[1], steps[0]) < 0.05 and steps[0].argmax() == steps[1].argmax()


def test_gradients_reach_the_adapter_through_the_quantized_projections(pair) -> None:
    grads = []
    for model in pair:
        config = model.config
        adapter = Adapter.fresh(config, 4, 8, TARGETS, list(range(config.num_hidden_layers)), 3, torch.device("cpu"))
        generator = torch.Generator().manual_seed(1)
        for name, tensor in adapter.tensors.items():
            if name.endswith(".b"):
                tensor.data = torch.randn(tensor.shape, generator=generator) * 0.05
        params = adapter.trainable()
        with attached(model, adapter):
            logits = model(IDS, vocab="all").logits
            loss = F.cross_entropy(logits[0, :-1], IDS[0, 1:])
            loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
        grads.append(torch.cat([p.grad.flatten() for p in params]))
    assert F.cosine_similarity(grads[0], grads[1], dim=0) > 0.99
    assert _relative(grads[1], grads[0]) < 0.1


def _json(run) -> dict:
    assert run.code == 0, run.err
    return run.json


def test_steering_train_extract_and_generate_work_at_int8(cli, tmp_path: Path) -> None:
    directions = {}
    for precision in ("f32", "int8"):
        out = tmp_path / f"calm-{precision}.ster.json"
        _json(cli("train", *TOY, "--pairs", "ster:pairs", "--output", out, "--precision", precision))
        directions[precision] = {v["layer"]: torch.tensor(v["values"]) for v in json.loads(out.read_text())["vectors"]}
    assert directions["f32"].keys() == directions["int8"].keys()
    for layer, vector in directions["f32"].items():
        assert F.cosine_similarity(vector, directions["int8"][layer], dim=0) > 0.98, layer

    states = {}
    for precision in ("f32", "int8"):
        out = tmp_path / f"states-{precision}.json"
        _json(cli("extract", *TOY, "--input", "ster:prompts", "--output", out, "--precision", precision))
        records = json.loads(out.read_text())["records"]
        states[precision] = torch.tensor(
            [x for r in records for layer in sorted(r["layers"]) for x in r["layers"][layer]]
        )
    assert _relative(states["int8"], states["f32"]) < 0.05

    prompt = "question : tell me about the town . answer :"
    vector = tmp_path / "calm-int8.ster.json"
    texts = {}
    for precision in ("f32", "int8"):
        for strength in ([], ["--vector", vector, "--strength", "0.4x"]):
            run = cli(
                "generate", *TOY, "--prompt", prompt, "--precision", precision, "--max-new-tokens", "8", *strength
            )
            texts[precision, bool(strength)] = _json(run)["text"]
    assert texts["int8", False] == texts["f32", False]
    assert texts["int8", True] == texts["f32", True] != texts["f32", False]


@pytest.mark.parametrize("objective", ["sft", "dpo", "reward"])
def test_lora_training_and_tune_evaluate_work_on_the_int8_base(cli, tmp_path: Path, objective: str) -> None:
    data = ["--examples", "ster:examples"] if objective == "sft" else ["--pairs", "ster:pairs"]
    reports = {}
    for precision in ("f32", "int8"):
        out = tmp_path / f"{objective}-{precision}.safetensors"
        run = cli(
            "tune",
            objective,
            *TOY,
            *data,
            "--output",
            out,
            "--precision",
            precision,
            "--epochs",
            "2",
            "--learning-rate",
            "5e-3",
        )
        reports[precision] = _json(run)["report"]
    f32, int8 = reports["f32"], reports["int8"]
    assert int8["precision"] == "int8" and int8["steps"] == f32["steps"]
    assert int8["first_loss"] == pytest.approx(f32["first_loss"], rel=0.05, abs=1e-3)
    assert int8["final_loss"] == pytest.approx(f32["final_loss"], rel=0.1, abs=1e-3)
    # the factors moved (B starts at zero), and moved as they do on the f32 base
    from safetensors.torch import load_file

    trained = {p: load_file(str(tmp_path / f"{objective}-{p}.safetensors")) for p in ("f32", "int8")}
    assert all(t.abs().sum() > 0 for name, t in trained["int8"].items() if name.endswith(".b"))
    flat = {
        p: torch.cat([t.flatten() for name, t in sorted(tensors.items()) if name.endswith(".b")])
        for p, tensors in trained.items()
    }
    # (0.996 for dpo and reward; sft's toy loss is near zero already, so Adam's steps follow tiny gradients: 0.79)
    assert F.cosine_similarity(flat["f32"], flat["int8"], dim=0) > 0.7
    if objective == "sft":
        evaluated = {}
        for precision in ("f32", "int8"):
            adapter = tmp_path / f"sft-{precision}.safetensors"
            run = cli(
                "tune", "evaluate", *TOY, "--examples", "ster:examples", "--adapter", adapter, "--precision", precision
            )
            evaluated[precision] = _json(run)
        assert evaluated["int8"]["loss"] == pytest.approx(evaluated["f32"]["loss"], rel=0.05)
