"""Data parallel training: ``torchrun --nproc-per-node 2 -m ster tune …`` on the toy, gloo on CPU.

Two processes split every step's forwards and sum their gradients, so they must train
the adapter one process trains from the same command (to 1e-5: only the order of the
float sums differs). Rank 0 alone reports and writes; rank 1 prints nothing. A rank
that fails does not leave the other waiting, and Ctrl-C (torchrun passes SIGINT on to
every rank) stops the ranks after the same step with one checkpoint that any number of
processes can resume.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ster.foreground import CANCELLING
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="gloo and POSIX signals")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(tmp_path: Path, *args: object) -> subprocess.CompletedProcess[str]:
    """Run on two ranks, each rank's stdout and stderr going to its own files under ``logs``."""
    command = [*TORCHRUN, "--log-dir", str(tmp_path / "logs"), "--redirects", "3", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=240, check=False)


def said(tmp_path: Path, rank: int) -> tuple[str, str]:
    """What ``rank`` wrote on its stdout and on its stderr."""
    (folder,) = (tmp_path / "logs").glob(f"*/attempt_0/{rank}")
    return (folder / "stdout.log").read_text(), (folder / "stderr.log").read_text()


def tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def assert_same_adapter(a: Path, b: Path) -> None:
    first, second = tensors(a), tensors(b)
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=1e-5, msg=name)


def assert_same_numbers(a: Any, b: Any) -> None:
    """Reports alike: every string, int and list length equal, every float within 1e-5."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_numbers(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_numbers(x, y)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (a, b)
    else:
        assert a == b


SFT = ["sft", "--examples", "ster:examples", "--batch-size", "2", "--accumulation", "2", "--epochs", "2"]
DPO = ["dpo", "--pairs", "ster:pairs", "--accumulation", "4", "--epochs", "2"]

GRPO = ["grpo", "--prompts", "ster:grpo-prompts", "--accumulation", "2", "--iterations", "2", "--max-new-tokens", "8"]


@pytest.mark.parametrize("command", [SFT, DPO, GRPO], ids=["sft", "dpo", "grpo"])
def test_two_ranks_train_the_adapter_one_process_trains(cli, tmp_path: Path, command: list[str]) -> None:
    tune = ["tune", *command, "--model", "ster:toy", "--learning-rate", "1e-2"]
    run = torchrun(tmp_path, "-m", "ster", *tune, "--output", tmp_path / "two.safetensors")
    assert run.returncode == 0, run.stderr
    one = cli(*tune, "--output", tmp_path / "one.safetensors")
    assert one.code == 0, one.err
    assert_same_adapter(tmp_path / "two.safetensors", tmp_path / "one.safetensors")
    out, err = said(tmp_path, 0)
    assert "data parallel over 2 processes; this one, rank 0, reports and writes" in err
    assert_same_numbers(json.loads(out)["report"], one.json["report"])
    if command is DPO:
        assert json.loads(out)["report"]["first_loss"] == one.json["report"]["first_loss"]  # the shared reference
    assert said(tmp_path, 1) == ("", "")  # rank 1: no result document, no progress


REFUSES_ON_RANK_1 = """
import os, sys
from ster.engine.protocol.errors import Refusal
from ster.engine.tune import objectives, rows

rows.PACK_TOKENS = 0  # every forward alone: the toy's short pairs would otherwise pack a step into one, on rank 0
if os.environ["RANK"] == "1":
    forwards, scored = [], objectives.Preference.losses

    def losses(self, decoder, units):
        forwards.append(units)
        if len(forwards) == 3:
            raise Refusal("rank 1 refuses its third forward")
        return scored(self, decoder, units)

    objectives.Preference.losses = losses
from ster.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_refusal_on_one_rank_ends_the_other(tmp_path: Path) -> None:
    """Rank 0 waits in the gradient sum for a rank that has gone; gloo tells it so, and both end."""
    script = tmp_path / "refuses_on_rank_1.py"
    script.write_text(REFUSES_ON_RANK_1)
    run = torchrun(tmp_path, script, "tune", *DPO, "--model", "ster:toy", "--output", tmp_path / "a.safetensors")
    assert run.returncode != 0
    assert said(tmp_path, 1) == ("", "rank 1: error: rank 1 refuses its third forward\n"), run.stderr
    out, err = said(tmp_path, 0)
    assert out == "" and err.splitlines()[-1].startswith("error: "), (err, run.stderr)
    assert not (tmp_path / "a.safetensors").exists() and not (tmp_path / "a.json").exists()


def test_ctrl_c_stops_both_ranks_after_the_same_step_and_any_process_resumes(cli, tmp_path: Path) -> None:
    tune = [
        "tune",
        "dpo",
        "--model",
        "ster:toy",
        "--pairs",
        "ster:pairs",
        "--epochs",
        "20",
        "--accumulation",
        "4",
        "--learning-rate",
        "5e-3",
    ]
    out = tmp_path / "a.safetensors"
    proc = subprocess.Popen(
        [*TORCHRUN, "-m", "ster", *tune, "--output", str(out)],
        cwd=REPO,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the workers share torchrun's stderr; only rank 0 writes to it
        if line.startswith("epoch 1/20 step 3/"):
            break
    else:
        pytest.fail(f"the run ended before step 3: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends torchrun, which sends it on to each rank
    _, err = proc.communicate(timeout=240)
    lines = err.splitlines()
    assert lines.count(CANCELLING) == 1, err
    stopped = [line for line in lines if line.startswith("cancelled after step ")]
    assert len(stopped) == 1 and f"the checkpoint at {out}.checkpoint continues it" in stopped[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors.checkpoint"]

    resumed = cli(*tune, "--output", out, "--resume")
    assert resumed.code == 0, resumed.err
    whole = cli(*tune, "--output", tmp_path / "whole.safetensors")
    assert_same_adapter(out, tmp_path / "whole.safetensors")
    assert_same_numbers(resumed.json["report"], whole.json["report"])
