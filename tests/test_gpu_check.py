"""``bench/gpu_check.sh``, the check a CUDA machine runs: without CUDA it says SKIP for every check and exits 0,
and its checks run and judge on the CPU (the script's ``--cpu`` dry run runs them all, on the toy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["decode-bf16", "decode-f16", "steer", "tune-sft", "tune-dpo", "torchrun", "generic"]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA, so the script runs its checks")
def test_without_cuda_every_check_is_skipped_and_the_script_exits_0() -> None:
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("machine: GPU none") and "; CPU: " in lines[0] and "torch " in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == [f"SKIP {name}" for name in CHECKS]


def test_a_check_prints_one_line_and_fails_with_a_sentence(tmp_path: Path) -> None:
    run = [
        sys.executable,
        "bench/gpu_check.py",
        "decode",
        "--device",
        "cpu",
        "--model",
        "ster:toy",
        "--tokens",
        "12",
        "--rounds",
        "1",
        "--precision",
        "bf16",
        "--name",
        "decode-bf16",
        "--work",
        str(tmp_path),
    ]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("PASS decode-bf16: 12 greedy tokens, ") and "tokens/s" in line
    proc = subprocess.run(
        [
            sys.executable,
            "bench/gpu_check.py",
            "tune",
            "--objective",
            "sft",
            "--device",
            "cpu",
            "--model",
            str(tmp_path / "nothing"),
            "--work",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    (line,) = proc.stdout.splitlines()
    assert line.startswith("FAIL tune: ster tune sft exited 1: error: ") and "nothing" in line
