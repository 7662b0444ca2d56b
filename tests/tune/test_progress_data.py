"""What each optimizer step's progress event carries, and the per-step margins checked independently.

dpo and ipo steps carry ``reward_margin``, the mean over the step's pairs of
β·(chosen log-ratio − rejected log-ratio); reward steps carry ``score_margin``, the mean of
the head's chosen − rejected score. Both come from numbers the step already has. The dpo
margin of a run's second step is checked against transformers' own model with the adapter
a one-step run writes folded in (the first step of both runs is the same step), and a
run whose final epoch is one step reports the margin its last step carried.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from ster.engine.model.adapters.lora import load_adapter
from ster.engine.model.config import load_config
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR, resolve_model
from tests.tune.test_tune_evaluate import sequence_logp, with_update

PAIRS = json.loads((EXAMPLES_DIR / "pairs.json").read_text())["pairs"]
ALL = ["--model", "ster:toy", "--pairs", "ster:pairs", "--accumulation", str(len(PAIRS)), "--learning-rate", "5e-2"]


def steps(run) -> list[dict]:
    assert run.code == 0, run.err
    return [e for e in run.events if e["type"] == "progress" and e["stage"] == "train" and e["current"]]


def test_every_step_carries_the_line_values_and_its_margin(cli, tmp_path: Path) -> None:
    for objective, margin in (("dpo", "reward_margin"), ("reward", "score_margin")):
        run = cli(
            "--json",
            "tune",
            objective,
            "--model",
            "ster:toy",
            "--pairs",
            "ster:pairs",
            "--accumulation",
            "4",
            "--epochs",
            "2",
            "--learning-rate",
            "1e-2",
            "--output",
            tmp_path / f"{objective}.safetensors",
        )
        events = steps(run)
        assert len(events) == 6
        for event in events:
            assert list(event["data"]) == ["epoch", "loss", "learning_rate", "tokens_per_second", "accuracy", margin]
            assert " reward_margin" not in event["message"] and " score_margin" not in event["message"]
            assert event["message"].endswith(f" accuracy {event['data']['accuracy']:.3f}")  # the contract's line
        assert events[0]["data"][margin] == 0.0  # a fresh adapter (a zero head) ranks nothing
        assert any(event["data"][margin] != 0.0 for event in events)


@pytest.mark.parametrize(
    ("objective", "margin", "report_margin"),
    [("dpo", "reward_margin", "mean_reward_margin"), ("reward", "score_margin", "mean_score_margin")],
)
def test_a_one_step_final_epoch_reports_its_last_steps_margin(
    cli, tmp_path: Path, objective: str, margin: str, report_margin: str
) -> None:
    run = cli("--json", "tune", objective, *ALL, "--epochs", "2", "--output", tmp_path / "a.safetensors")
    last = steps(run)[-1]["data"]
    report = run.events[-1]["data"]["report"]
    assert report["steps"] == 2 and last[margin] != 0.0
    assert last[margin] == pytest.approx(report[report_margin], rel=1e-9, abs=1e-12)
    assert last["accuracy"] == report["accuracy"]


@pytest.mark.parametrize(("loss", "beta"), [("dpo", 0.1), ("ipo", 0.25)])
def test_the_step_margin_equals_an_independent_computation(cli, tmp_path: Path, loss: str, beta: float) -> None:
    from transformers import LlamaForCausalLM

    one = tmp_path / "one.safetensors"
    flags = [*ALL, "--loss", loss, "--beta", str(beta)]
    assert len(steps(cli("--json", "tune", "dpo", *flags, "--epochs", "1", "--output", one))) == 1
    second = steps(cli("--json", "tune", "dpo", *flags, "--epochs", "2", "--output", tmp_path / "two.safetensors"))[1]
    source = resolve_model("ster:toy")
    _, adapter = load_adapter(one, load_config(source.config), torch.device("cpu"))
    base = LlamaForCausalLM.from_pretrained(str(TOY_DIR), dtype=torch.float32).eval()
    policy, tokenizer = with_update(base, adapter), Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))
    margins = []
    for pair in PAIRS:
        ratios = []
        for side in (pair["positive"], pair["negative"]):
            ratio = sequence_logp(policy, tokenizer, side) - sequence_logp(base, tokenizer, side)
            ratios.append(ratio / (len(tokenizer.encode(side).ids) - 1) if loss == "ipo" else ratio)
        margins.append(beta * (ratios[0] - ratios[1]))
    expected = sum(margins) / len(margins)
    assert abs(expected) > 1e-4  # the step moved the policy
    assert second["data"]["reward_margin"] == pytest.approx(expected, rel=1e-3, abs=2e-6)
