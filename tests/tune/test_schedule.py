"""The schedule: the learning rate of every step, how many steps a run takes, and how a step's loss is scaled.

The rates are checked against numbers worked out by hand from the contract's formula
(linear warmup, then a cosine to a tenth of the base rate), and against the rate each
step of a real run reports. The scaling is checked on the loop itself with a stand-in
objective whose gradient is known: every unit's loss is divided by the constant
``batch × accumulation``, so a short tail step is proportionally smaller.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.loop import Loop, Settings, learning_rate
from ster.engine.tune.objectives import Objective, Unit
from ster.engine.tune.parallel import Parallel


@pytest.mark.parametrize(
    ("step", "warmup", "total", "expected"),
    [
        (0, 3, 10, 1e-3 / 3),  # warmup: base · (s + 1) / warmup
        (1, 3, 10, 2e-3 / 3),
        (2, 3, 10, 1e-3),
        (3, 3, 10, 1e-3),  # the cosine starts at the base rate
        (0, 0, 2, 1e-3),
        (1, 0, 2, 0.55e-3),  # halfway down the cosine: (base + base / 10) / 2
        (5, 1, 5, 1e-4),  # at the end of the cosine: a tenth of the base rate
    ],
)
def test_the_rate_follows_warmup_then_cosine_to_a_tenth(step: int, warmup: int, total: int, expected: float) -> None:
    assert learning_rate(1e-3, step, warmup, total) == pytest.approx(expected, rel=1e-12)


def test_each_step_reports_the_rate_it_took(cli, tmp_path: Path) -> None:
    run = cli(
        "--json",
        "tune",
        "sft",
        "--model",
        "ster:toy",
        "--examples",
        "ster:examples",
        "--output",
        tmp_path / "a.safetensors",
        "--epochs",
        "3",
        "--accumulation",
        "2",
        "--warmup-steps",
        "2",
        "--learning-rate",
        "1e-2",
    )
    steps = [e for e in run.events if e["type"] == "progress" and e["stage"] == "train" and e["current"]]
    total = steps[0]["total"]
    assert [e["current"] for e in steps] == list(range(1, total + 1))
    for event in steps:
        s = event["current"] - 1
        expected = 1e-2 * (s + 1) / 2 if s < 2 else 1e-3 + 9e-3 * 0.5 * (1 + math.cos(math.pi * (s - 2) / (total - 2)))
        assert event["data"]["learning_rate"] == pytest.approx(expected, rel=1e-12)


@pytest.fixture
def eight_pairs(tmp_path: Path) -> Path:
    pairs = json.loads((EXAMPLES_DIR / "pairs.json").read_text())
    path = tmp_path / "eight.json"
    path.write_text(json.dumps({**pairs, "pairs": pairs["pairs"][:8]}))
    return path


@pytest.mark.parametrize(
    ("flags", "steps"),
    [
        (["--epochs", "3", "--accumulation", "4"], 6),  # the contract's toy acceptance: ceil(8 / 4) · 3
        (["--epochs", "2", "--accumulation", "3"], 6),  # ceil(8 / 3) · 2: a short tail step per epoch
        (["--batch-size", "3", "--accumulation", "2"], 2),  # ceil(8 / (3 · 2))
    ],
)
def test_steps_are_units_over_batch_times_accumulation_rounded_up_per_epoch(
    cli, tmp_path: Path, eight_pairs: Path, flags: list[str], steps: int
) -> None:
    run = cli(
        "tune", "dpo", "--model", "ster:toy", "--pairs", eight_pairs, "--output", tmp_path / "a.safetensors", *flags
    )
    assert run.code == 0, run.err
    assert run.json["report"]["steps"] == steps and run.json["report"]["trained_pairs"] == 8
    assert f"step {steps}/{steps} " in run.err


class Counting(Objective):
    """Every unit's loss is the one weight ``w``, so a step's gradient counts its units, scaled."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.forwards: list[list[int]] = []

    def losses(self, decoder, units):
        self.forwards.append([unit.length for unit in units])
        return self.weight * torch.ones(len(units)), [{"loss": 1.0} for _ in units]


def test_every_unit_loss_is_divided_by_the_constant_batch_times_accumulation() -> None:
    weight = torch.zeros((), requires_grad=True)
    objective = Counting(weight)
    units = [Unit(i, ([0] * length,), (1,)) for i, length in enumerate([3, 5, 4, 6, 2])]
    settings = Settings(epochs=1, batch=2, accumulation=2, learning_rate=0.1, warmup_steps=0, seed=7)
    loop = Loop(None, [weight], objective, units, settings, JobContext(lambda event: None), Parallel())
    gradients = []
    step = loop.optimizer.step
    loop.optimizer.step = lambda: (gradients.append(float(weight.grad)), step())[1]
    loop.run(lambda current: "unused")
    assert loop.total == 2 and gradients == [1.0, 0.25]  # four units / 4, then the one left over / 4
    step, tail = objective.forwards  # the step's two forwards of two pack into one (rows.PACK_TOKENS)
    assert step == sorted(step, reverse=True)  # a step's units go longest first
    assert sorted(step + tail) == [2, 3, 4, 5, 6]
