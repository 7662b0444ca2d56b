"""Real checks on a second family: Gemma 3 270M, the base model, imported from its Q4_K_M GGUF (``real`` marker).

The model has no chat template, so every prompt and pair side is raw text. Its residual norms grow
from about 160 at block 0 to about 40,000 at block 17, so strengths are relative (``0.1x``).
One model store serves every job in this module, so the weights load once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.model.loading import ModelStore
from ster.engine.protocol.jobs import build_job_request, run_job

pytestmark = pytest.mark.real
DATA = Path(__file__).parents[1] / "data"
FIT, HOLDOUT = DATA / "calm-fit.json", DATA / "calm-holdout.json"
PLAIN = "The capital of France is"
"""Greedily the base model continues this with `` the capital of the country of France. It is the largest city
in France…`` and names no city within 64 tokens; transformers continues it identically."""
QUESTION = "Question: What is the capital of France?\nAnswer:"
"""The pair sets' own raw format, which the base model answers with `` Paris``."""
STEERED = "Question: I smell smoke in the kitchen.\nAnswer:"
PREFERENCE_PAIRS = 4


@pytest.fixture(scope="module")
def store() -> ModelStore:
    return ModelStore()


def job(store: ModelStore, name: str, **fields: object) -> dict:
    """Run job ``name`` as the CLI does (the same request model from the same fields), on the shared store."""
    final = run_job(name, build_job_request(name, **fields), lambda event: None, models=store)
    assert final.type == "result", final
    return final.data


def test_the_import_is_a_gemma3_text_checkpoint_without_a_chat_template(gemma: Path) -> None:
    config = json.loads((gemma / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("gemma3_text", 18, 640)
    assert "chat_template" not in json.loads((gemma / "tokenizer_config.json").read_text())


def test_greedy_ids_equal_transformers(gemma: Path, store: ModelStore) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ster.engine.model.decoding import decode
    from ster.engine.model.sampling import Sampling
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.requests import GenerateRequest

    ctx = JobContext(lambda event: None, models=store)
    checkpoint = store.open(GenerateRequest(model=str(gemma), prompt=PLAIN), ctx)
    prompt = checkpoint.codec.encode_prompt(PLAIN)
    ours = decode(
        store.decoder(checkpoint, ctx),
        prompt,
        max_new_tokens=24,
        sampling=Sampling(),
        eos_ids=checkpoint.codec.eos_ids,
        on_token=lambda index, token: None,
        check_cancelled=lambda: None,
    ).ids
    tokenizer = AutoTokenizer.from_pretrained(gemma)
    reference = AutoModelForCausalLM.from_pretrained(gemma, dtype=torch.float32).eval()
    assert prompt == tokenizer(PLAIN)["input_ids"]
    with torch.inference_mode():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
    assert ours == expected.tolist()
    text = job(store, "generate", model=str(gemma), prompt=PLAIN, max_new_tokens=24)["text"]
    assert text == tokenizer.decode(expected)


def test_greedy_answer_names_paris(cli, gemma: Path) -> None:
    """Asked in the pair sets' raw question format; the plain ``The capital of France is`` names no city."""
    run = cli("generate", "--model", gemma, "--prompt", QUESTION, "--max-new-tokens", "4")
    assert run.code == 0, run.err
    assert run.json["chat_template"] == "absent"
    assert run.json["text"].startswith(" Paris")


@pytest.fixture(scope="module")
def calm(gemma: Path, store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The calm direction at layer 7, by logistic regression on the 24 raw-text pairs: what ``optimize`` with its
    defaults picks over all 18 layers (holdout accuracy 1.0, separation 37.5, the largest)."""
    out = tmp_path_factory.mktemp("gemma-calm") / "calm.ster.json"
    job(store, "train", model=str(gemma), pairs=FIT, output=out, layers="7", method="logistic", chat_template="off")
    return out


def test_the_direction_separates_held_out_pairs(gemma: Path, store: ModelStore, calm: Path) -> None:
    result = job(store, "evaluate", model=str(gemma), pairs=HOLDOUT, vector=calm, chat_template="off")
    assert result["pair_count"] == 24 and result["chat_template"] == "off"
    assert [layer["accuracy"] >= 0.8 for layer in result["layers"]] == [True]


def test_steering_moves_the_answers_both_ways_at_the_default_strength(
    gemma: Path, store: ModelStore, calm: Path
) -> None:
    """Steered at ±0.4x (the default, of the layer's activation spread, about a tenth of Gemma's norm, which its
    massive activations inflate), the model prefers the calm answer to each held-out question more (+) or less (−) than
    unsteered, by the answers' summed log-probabilities; both steered greedy texts differ from the unsteered one."""
    gaps = {strength: _calm_preference(gemma, store, calm, strength) for strength in (-0.4, 0.0, 0.4)}
    assert gaps[-0.4] < gaps[0.0] < gaps[0.4], gaps
    texts = {
        strength: job(
            store, "generate", model=str(gemma), prompt=STEERED, vector=calm, strength=f"{strength}x", max_new_tokens=8
        )["text"]
        for strength in (-0.4, 0.0, 0.4)
    }
    assert texts[-0.4] != texts[0.0] != texts[0.4], texts


def _calm_preference(gemma: Path, store: ModelStore, calm: Path, strength: float) -> float:
    """Mean over the first held-out pairs of log p(calm answer | question) − log p(alarmed answer | question),
    steered at ``strength`` × the layer's activation spread (nats)."""
    import torch

    from ster.engine.model.requests import ModelRequest
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.apply import plan, steer
    from ster.engine.steering.artifact import load_artifact

    ctx = JobContext(lambda event: None, models=store)
    checkpoint = store.open(ModelRequest(model=str(gemma), chat_template="off"), ctx)
    model, artifact = store.decoder(checkpoint, ctx), load_artifact(calm)
    assert artifact.strength_unit == "spread"
    scales = {layer: strength * (unit or 0.0) for layer, unit in artifact.unit_scales().items()}

    def answer(text: str) -> float:
        question = checkpoint.codec.encode_prompt(text[: text.index("\nAnswer:") + len("\nAnswer:")])
        ids = checkpoint.codec.encode_prompt(text)
        assert ids[: len(question)] == question
        logits = model(torch.tensor([ids]), vocab="all").logits[0, len(question) - 1 : -1].float()  # [answer, V]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[len(question) :])[:, None]).sum().item()

    pairs = json.loads(HOLDOUT.read_text())["pairs"][:PREFERENCE_PAIRS]
    with torch.inference_mode(), steer(model, plan(model, artifact.by_layer(), scales)):
        return sum(answer(pair["positive"]) - answer(pair["negative"]) for pair in pairs) / len(pairs)


def test_a_short_dpo_run_lowers_its_loss(gemma: Path, store: ModelStore, tmp_path: Path) -> None:
    """Calm chosen, alarmed rejected: six raw-text pairs, rank 2, three steps."""
    pairs = json.loads(FIT.read_text())
    (tmp_path / "pairs.json").write_text(json.dumps({**pairs, "pairs": pairs["pairs"][:6]}))
    report = job(
        store,
        "tune dpo",
        model=str(gemma),
        pairs=tmp_path / "pairs.json",
        output=tmp_path / "calm.safetensors",
        rank=2,
        accumulation=2,
        learning_rate=1e-3,
    )["report"]
    assert report["steps"] == 3 and report["chat_template"] == "absent"
    assert report["first_loss"] == pytest.approx(0.6931471824645996)  # a fresh adapter is the identity
    assert report["final_loss"] < report["first_loss"] / 2, report["history"]
