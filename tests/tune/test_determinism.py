"""The same command twice writes the same adapter, byte for byte.

Each run is its own ``python -m ster`` process with torch's threads pinned to one
(torch reads ``OMP_NUM_THREADS``), so nothing carries over between the two but the
command: ``--seed`` alone fixes the A draw and every epoch's order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PINNED = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def ster(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ster", *map(str, args)],
        cwd=REPO,
        env=PINNED,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["sft", "--examples", "ster:examples", "--epochs", "2", "--accumulation", "2", "--learning-rate", "1e-2"],
        ["dpo", "--pairs", "ster:pairs", "--epochs", "2", "--accumulation", "4", "--learning-rate", "1e-2"],
        ["dpo", "--pairs", "ster:pairs", "--batch-size", "3", "--accumulation", "2", "--learning-rate", "1e-2"],
        [
            "grpo",
            "--prompts",
            "ster:grpo-prompts",
            "--iterations",
            "2",
            "--accumulation",
            "2",
            "--max-new-tokens",
            "8",
            "--learning-rate",
            "1e-2",
        ],
    ],
    ids=["sft", "dpo", "dpo-batch-3", "grpo"],
)
def test_the_same_command_twice_writes_the_same_bytes(tmp_path: Path, command: list[str]) -> None:
    outputs = [tmp_path / name / "adapter.safetensors" for name in ("first", "second")]
    runs = [ster("tune", *command, "--model", "ster:toy", "--seed", "5", "--output", out) for out in outputs]
    for run in runs:  # side by side: nothing but the command is shared
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
