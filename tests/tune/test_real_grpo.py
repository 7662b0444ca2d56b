"""GRPO on a real model, SmolLM2-135M-Instruct: each reward source moves what it rewards.

* With the length reward, asked for one-word answers (which the model does not keep to), the
  mean completion length rises from the first iteration to the last.
* With the reward model ``tune reward`` trains on calm-chosen / alarmed-rejected pairs, the
  reward model's mean score of the policy's completions rises.

Kept small (two prompts or four, short completions, two or three iterations) so both run in a
few minutes on two cores; the learning rates are high for the same reason (at 5e-3 the calm reward
model's policy collapses to empty completions within two steps, which GRPO refuses).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tune.conftest import CALM_PROMPTS, DATA

pytestmark = pytest.mark.real

SHORT = DATA / "tune" / "short-prompts.json"


def _grpo(cli, smol: Path, out: Path, *flags: object) -> dict:
    run = cli("tune", "grpo", "--model", smol, "--output", out, *flags)
    assert run.code == 0, run.err
    return run.json["report"]


def test_the_length_reward_lengthens_completions(cli, smol: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": json.loads(SHORT.read_text())["prompts"][:2]}))
    report = _grpo(
        cli,
        smol,
        tmp_path / "longer.safetensors",
        "--prompts",
        prompts,
        "--iterations",
        "3",
        "--learning-rate",
        "5e-3",
        "--max-new-tokens",
        "24",
    )
    lengths = [entry["mean_completion_tokens"] for entry in report["history"]]
    assert report["first_loss"] == 0.0
    assert lengths[-1] > lengths[0], lengths
    assert report["mean_kl"] > 0


def test_a_reward_model_s_reward_rises(cli, smol: Path, tmp_path: Path, trained: dict[str, Path]) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": json.loads(CALM_PROMPTS.read_text())["prompts"][:4]}))
    report = _grpo(
        cli,
        smol,
        tmp_path / "calmer.safetensors",
        "--prompts",
        prompts,
        "--reward",
        trained["reward"],
        "--iterations",
        "2",
        "--accumulation",
        "2",
        "--max-new-tokens",
        "24",
        "--learning-rate",
        "1e-3",
    )
    assert report["reward"] == f"reward:{trained['reward']}"
    rewards = [entry["mean_reward"] for entry in report["history"]]
    assert rewards[-1] > rewards[0], rewards
