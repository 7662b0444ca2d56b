"""``tune evaluate``: completion loss and perplexity on examples, and preference accuracy on pairs.

The numbers are checked against an independent computation: transformers' own
``LlamaForCausalLM`` on the toy checkpoint, with an adapter's update folded into a copy
of its weights by hand (W + alpha/rank · B A).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from ster.engine.model.adapters.artifact import factor_names
from ster.engine.model.adapters.lora import Adapter
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.engine.tune.merge import weight_name
from tests.tune.adapter_files import write_adapter

EXAMPLES = json.loads((EXAMPLES_DIR / "examples.json").read_text())["examples"]
PAIRS = json.loads((EXAMPLES_DIR / "pairs.json").read_text())["pairs"]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(TOY_DIR), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))


def with_update(model, adapter: Adapter):
    """A copy of transformers' model with the adapter's update folded into its weights."""
    merged = copy.deepcopy(model)
    state = merged.state_dict()
    with torch.no_grad():
        for layer in adapter.layers:
            for target in adapter.targets:
                a, b = (adapter.tensors[name] for name in factor_names(layer, target))
                state[weight_name(layer, target)] += adapter.scale * (b @ a)
    return merged


def completion_nll(model, tokenizer: Tokenizer, prompt: str, completion: str) -> tuple[float, int]:
    prompt_ids = tokenizer.encode(prompt).ids
    completion_ids = tokenizer.encode(completion, add_special_tokens=False).ids
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    n = len(prompt_ids)
    return -sum(float(logp[n - 1 + i, token]) for i, token in enumerate(completion_ids)), len(completion_ids)


def sequence_logp(model, tokenizer: Tokenizer, text: str) -> float:
    ids = tokenizer.encode(text).ids
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids)))


def evaluate(cli, *args: str) -> dict:
    run = cli("tune", "evaluate", "--model", "ster:toy", *args)
    assert run.code == 0, run.err
    return run.json


@pytest.mark.parametrize("b_scale", [0.0, 0.2])
def test_example_losses_equal_an_independent_computation(cli, tmp_path: Path, hf_model, tokenizer, b_scale) -> None:
    path = tmp_path / "a.safetensors"
    adapter = write_adapter(path, b_scale=b_scale, targets=("query", "value", "down"), layers=(1, 3))
    report = evaluate(cli, "--examples", "ster:examples", "--adapter", path)
    reference = with_update(hf_model, adapter)
    nlls = [completion_nll(reference, tokenizer, e["prompt"], e["completion"]) for e in EXAMPLES]
    for entry, (nll, tokens) in zip(report["entries"], nlls):
        assert entry["completion_tokens"] == tokens
        assert entry["loss"] == pytest.approx(nll / tokens, rel=1e-5, abs=1e-7)
        assert entry["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    total_tokens = sum(tokens for _, tokens in nlls)
    assert report["completion_tokens"] == total_tokens
    assert report["loss"] == pytest.approx(sum(nll for nll, _ in nlls) / total_tokens, rel=1e-5)
    assert report["perplexity"] == pytest.approx(math.exp(report["loss"]), rel=1e-12)
    mean = sum(nll / tokens for nll, tokens in nlls) / len(nlls)
    assert report["mean_example_loss"] == pytest.approx(mean, rel=1e-5)
    assert report["mean_example_perplexity"] == pytest.approx(math.exp(report["mean_example_loss"]), rel=1e-12)
    assert report["adapter"] == str(path)


def test_the_report_and_the_progress(cli) -> None:
    run = cli("tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples")
    report = run.json
    assert list(report) == [
        "model",
        "model_revision",
        "adapter",
        "name",
        "examples",
        "evaluated",
        "skipped_long",
        "completion_tokens",
        "loss",
        "perplexity",
        "mean_example_loss",
        "mean_example_perplexity",
        "chat_template",
        "precision",
        "entries",
    ]
    assert list(report["entries"][0]) == ["index", "prompt", "completion", "completion_tokens", "loss", "perplexity"]
    assert (report["adapter"], report["examples"], report["evaluated"], report["skipped_long"]) == (None, 8, 8, 0)
    lines = run.err.splitlines()
    first = report["entries"][0]
    assert f"example 1/8 loss {first['loss']:.4f} perplexity {first['perplexity']:.4f}" in lines
    assert (
        f"8 examples, {report['completion_tokens']} completion tokens, loss {report['loss']:.4f}, "
        f"perplexity {report['perplexity']:.4f}"
    ) in lines


def test_batched_equals_unbatched(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.3)
    one = evaluate(cli, "--examples", "ster:examples", "--adapter", path)
    three = evaluate(cli, "--examples", "ster:examples", "--adapter", path, "--batch-size", "3")
    for a, b in zip(one["entries"], three["entries"]):
        assert a["completion_tokens"] == b["completion_tokens"]
        assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(one["loss"] - three["loss"]) < 1e-5


def test_a_template_scores_one_more_completion_token_per_example(cli) -> None:
    applied = evaluate(cli, "--model", "ster:toy-chat", "--examples", "ster:chat-examples")
    off = evaluate(cli, "--model", "ster:toy-chat", "--examples", "ster:chat-examples", "--chat-template", "off")
    assert (applied["chat_template"], off["chat_template"]) == ("applied", "off")
    assert [e["completion_tokens"] for e in applied["entries"]] == [e["completion_tokens"] + 1 for e in off["entries"]]
    assert applied["completion_tokens"] == off["completion_tokens"] + applied["examples"]


def test_a_long_example_is_skipped_and_all_long_is_refused(cli) -> None:
    run = cli("tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples", "--max-sequence", "17")
    report = run.json
    assert report["skipped_long"] > 0 and report["evaluated"] + report["skipped_long"] == 8
    assert any(
        line.startswith("skipping example ") and line.endswith("tokens exceed the 17 token limit")
        for line in run.err.splitlines()
    )
    run = cli("tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples", "--max-sequence", "3")
    assert (run.code, run.err.splitlines()[-1]) == (
        1,
        "error: every example is longer than the sequence limit, so there is nothing to evaluate",
    )


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (
            ["--examples", "ster:examples", "--max-sequence", "1"],
            "max_sequence must be at least two tokens, so that one token can predict another",
        ),
        (["--examples", "ster:examples", "--batch-size", "0"], "evaluation requires a batch of at least one example"),
        (
            ["--pairs", "ster:pairs", "--adapter", "a.safetensors", "--batch-size", "0"],
            "evaluation requires a batch of at least one pair",
        ),
        (
            ["--examples", "ster:examples", "--pairs", "ster:pairs"],
            "tune evaluate takes --examples (completion loss) or --pairs (preference accuracy), exactly one of them",
        ),
        ([], "tune evaluate takes --examples (completion loss) or --pairs (preference accuracy), exactly one of them"),
        (
            ["--pairs", "ster:pairs"],
            (
                "tune evaluate --pairs measures an adapter: give --adapter, a generation adapter "
                "(implicit-reward accuracy) or a reward model (ranking accuracy)"
            ),
        ),
        (
            ["--pairs", "ster:pairs", "--adapter", "a.safetensors", "--beta", "0"],
            "evaluation requires a finite beta above zero",
        ),
    ],
)
def test_refusals(cli, args: list[str], sentence: str) -> None:
    run = cli("tune", "evaluate", "--model", "ster:toy", *args)
    assert (run.code, run.out, run.err) == (1, "", f"error: {sentence}\n")


def test_the_refusal_is_in_the_function_not_the_flag() -> None:
    from ster.engine.protocol.errors import Refusal
    from ster.engine.protocol.jobs import build_job_request

    with pytest.raises(Refusal, match="^evaluation requires a batch of at least one example$"):
        build_job_request("tune evaluate", model="ster:toy", examples="ster:examples", batch_size=0)


def test_adapter_provenance_is_warned_and_silent_when_unrecorded(cli, tmp_path: Path) -> None:
    trained = tmp_path / "off.safetensors"
    write_adapter(trained, model="ster:toy-chat", train={"chat_template": "off", "precision": "f16"})
    run = cli("tune", "evaluate", "--model", "ster:toy-chat", "--examples", "ster:chat-examples", "--adapter", trained)
    assert run.code == 0, run.err
    assert (
        "warning: this adapter was trained with chat template off and this run encodes applied, so the number "
        "below describes a format it was not trained in"
    ) in run.err.splitlines()
    assert (
        "warning: this adapter was trained at precision f16 and this run maps the base weights at f32, so it is "
        "being read in a different space than it was fitted in"
    ) in run.err.splitlines()
    unrecorded = tmp_path / "plain.safetensors"
    write_adapter(unrecorded, model="ster:toy-chat")
    run = cli(
        "tune", "evaluate", "--model", "ster:toy-chat", "--examples", "ster:chat-examples", "--adapter", unrecorded
    )
    assert run.code == 0 and "warning" not in run.err


def test_implicit_reward_accuracy_equals_an_independent_computation(cli, tmp_path: Path, hf_model, tokenizer) -> None:
    path = tmp_path / "dpo.safetensors"
    adapter = write_adapter(path, b_scale=0.3, seed=3)
    report = evaluate(cli, "--pairs", "ster:pairs", "--adapter", path, "--beta", "0.5")
    policy = with_update(hf_model, adapter)
    rewards = [
        [
            0.5 * (sequence_logp(policy, tokenizer, side) - sequence_logp(hf_model, tokenizer, side))
            for side in (pair["positive"], pair["negative"])
        ]
        for pair in PAIRS
    ]
    assert (report["measure"], report["loss"], report["beta"], report["pairs"]) == (
        "implicit_reward",
        "dpo",
        0.5,
        len(PAIRS),
    )
    for entry, (chosen, rejected) in zip(report["entries"], rewards):
        assert entry["chosen"] == pytest.approx(chosen, abs=2e-5)
        assert entry["rejected"] == pytest.approx(rejected, abs=2e-5)
        assert entry["correct"] == (entry["chosen"] > entry["rejected"])
    assert report["accuracy"] == sum(c > r for c, r in rewards) / len(PAIRS)
    assert report["mean_margin"] == pytest.approx(sum(c - r for c, r in rewards) / len(PAIRS), abs=2e-5)
    batched = evaluate(cli, "--pairs", "ster:pairs", "--adapter", path, "--beta", "0.5", "--batch-size", "4")
    for a, b in zip(report["entries"], batched["entries"]):
        assert abs(a["chosen"] - b["chosen"]) < 1e-5 and abs(a["rejected"] - b["rejected"]) < 1e-5


def test_a_fresh_adapter_has_no_implicit_reward(cli, tmp_path: Path) -> None:
    path = tmp_path / "fresh.safetensors"
    write_adapter(path)
    report = evaluate(cli, "--pairs", "ster:pairs", "--adapter", path)
    assert all(e["chosen"] == 0.0 and e["rejected"] == 0.0 for e in report["entries"])
    assert (report["accuracy"], report["tied_pairs"]) == (0.0, len(PAIRS))
    assert report["mean_loss"] == float(torch.tensor(math.log(2), dtype=torch.float32))  # ln 2 in f32, exactly


def test_reward_model_accuracy_equals_an_independent_computation(cli, tmp_path: Path, hf_model, tokenizer) -> None:
    path = tmp_path / "judge.safetensors"
    adapter = write_adapter(path, kind="reward", b_scale=0.2, head_scale=1.0)
    run = cli("tune", "evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--adapter", path)
    report = run.json
    scored = with_update(hf_model, adapter)

    def score(text: str) -> float:
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            last = scored(ids, output_hidden_states=True).hidden_states[-1][0, -1]  # after the final norm
        return float(last @ adapter.head[0])

    scores = [(score(p["positive"]), score(p["negative"])) for p in PAIRS]
    assert (report["measure"], report["loss"], report["beta"]) == ("reward_model", None, None)
    for entry, (chosen, rejected) in zip(report["entries"], scores):
        assert entry["chosen"] == pytest.approx(chosen, abs=1e-4)
        assert entry["rejected"] == pytest.approx(rejected, abs=1e-4)
    assert report["accuracy"] == sum(c > r for c, r in scores) / len(PAIRS)
    assert f"pair 1/{len(PAIRS)} chosen score" in run.err and f"{len(PAIRS)} pairs, accuracy" in run.err
