"""Runs that survive interruption: checkpoints, ``--resume``, and Ctrl-C during training.

A resumed run must end exactly where the uninterrupted run ends: the same adapter bytes
and the same report (first loss, history, accuracy and the rest). Two ways to stop a
run are checked: dying at once after a periodic checkpoint (as a killed process does;
here the job is stopped dead inside its own process), and a real SIGINT sent to a real
``python -m ster`` process, which finishes its step, writes a checkpoint and exits 130.
A checkpoint of another run is refused, before torch is imported, naming the difference.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ster.cli import _request
from ster.commands import build_parser
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.engine.protocol.events import Log
from ster.engine.protocol.jobs import run_job
from ster.foreground import CANCELLING
from tests.conftest import REPO

PINNED = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
DATA = {"sft": ["--examples", "ster:examples"], "dpo": ["--pairs", "ster:pairs"], "reward": ["--pairs", "ster:pairs"]}
FLAGS = ["--model", "ster:toy", "--epochs", "3", "--accumulation", "4", "--learning-rate", "5e-3"]


class Killed(BaseException):
    """Ends a job the way SIGKILL ends a process: no handler in the job runs."""


def killed_after_checkpoint(argv: list[str], step: int) -> None:
    """Run ``ster ARGV`` in this process and stop it dead once its checkpoint after ``step`` is written."""
    args = build_parser().parse_args(argv)

    def emit(event: object) -> None:
        if isinstance(event, Log) and event.message.startswith(f"checkpoint after step {step} "):
            raise Killed

    with pytest.raises(Killed):
        run_job(args.job, _request(args), emit)


def checkpoint(output: Path) -> Path:
    return output.with_name(output.name + ".checkpoint")


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("objective", ["sft", "dpo", "reward"])
def test_a_run_killed_after_a_periodic_checkpoint_resumes_to_the_same_adapter(
    cli, tmp_path: Path, objective: str
) -> None:
    whole = cli("tune", objective, *FLAGS, *DATA[objective], "--output", tmp_path / "whole" / "a.safetensors")
    assert whole.code == 0, whole.err
    out = tmp_path / "cut" / "a.safetensors"
    command = ["tune", objective, *FLAGS, *DATA[objective], "--output", str(out), "--checkpoint-every", "2"]
    killed_after_checkpoint(command, step=4)
    assert files(out.parent) == ["a.safetensors.checkpoint"]  # written atomically: no temporary is left
    resumed = cli(*command, "--resume")
    assert resumed.code == 0, resumed.err
    assert f"resuming after step 4 of {whole.json['report']['steps']}" in resumed.err
    assert "under the frozen reference model" not in resumed.err  # dpo's reference comes from the checkpoint
    assert resumed.json["report"] == whole.json["report"]
    assert out.read_bytes() == (tmp_path / "whole" / "a.safetensors").read_bytes()
    assert files(out.parent) == ["a.json", "a.safetensors"]  # the checkpoint goes once the adapter is written


def ster(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ster", *map(str, args)],
        cwd=REPO,
        env=PINNED,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_writes_a_checkpoint_and_resume_ends_where_the_whole_run_ends(tmp_path: Path) -> None:
    long = [
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
    whole = ster(*long, "--output", tmp_path / "whole" / "a.safetensors")
    out = tmp_path / "cut" / "a.safetensors"
    cut = ster(*long, "--output", out)
    assert cut.stderr is not None
    for line in cut.stderr:
        if line.startswith("epoch ") and int(re.search(r" step (\d+)/", line)[1]) >= 3:
            break
    else:
        pytest.fail(f"the run ended before step 3: {cut.communicate()}")
    cut.send_signal(signal.SIGINT)
    _, err = cut.communicate(timeout=300)
    lines = err.splitlines()
    assert cut.returncode == 130, err
    assert CANCELLING in lines and lines.index(CANCELLING) >= len(lines) - 4, err  # the step in flight finishes
    stopped = re.fullmatch(
        rf"cancelled after step (\d+) of 60; the checkpoint at {re.escape(str(checkpoint(out)))} "
        r"continues it when the same command is given with --resume",
        lines[-1],
    )
    assert stopped and 3 <= int(stopped[1]) < 60, err
    assert files(out.parent) == ["a.safetensors.checkpoint"]  # nothing at --output, no sidecar, no temporary

    resumed = ster(*long, "--output", out, "--resume")
    resumed_out, resumed_err = resumed.communicate(timeout=300)
    whole_out, whole_err = whole.communicate(timeout=300)
    assert resumed.returncode == 0 and whole.returncode == 0, resumed_err + whole_err
    assert f"resuming after step {stopped[1]} of 60" in resumed_err
    assert out.read_bytes() == (tmp_path / "whole" / "a.safetensors").read_bytes()
    assert json.loads(resumed_out)["report"] == json.loads(whole_out)["report"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dpo run on ster:pairs stopped dead after its first step's checkpoint; returns its output path."""
    out = tmp_path_factory.mktemp("saved") / "a.safetensors"
    killed_after_checkpoint(
        ["tune", "dpo", *FLAGS, "--pairs", "ster:pairs", "--output", str(out), "--checkpoint-every", "1"], step=1
    )
    return out


def _other_model(tmp_path: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "other-toy"
    shutil.copytree(TOY_DIR, model)
    weights = load_file(str(model / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * 1.5
    save_file(weights, str(model / "model.safetensors"))
    return model


def _eight_pairs(tmp_path: Path) -> Path:
    pairs = json.loads((EXAMPLES_DIR / "pairs.json").read_text())
    (tmp_path / "eight.json").write_text(json.dumps({**pairs, "pairs": pairs["pairs"][:8]}))
    return tmp_path / "eight.json"


@pytest.mark.parametrize(
    ("objective", "change", "difference"),
    [
        ("dpo", ["--learning-rate", "1e-3"], "its --learning-rate is 0.005, this run's is 0.001"),
        ("dpo", ["--seed", "3"], "its --seed is 42, this run's is 3"),
        ("dpo", ["--loss", "ipo"], "its --loss is dpo, this run's is ipo"),
        ("dpo", ["--pairs", "EIGHT"], "its training data differs from this run's"),
        ("dpo", ["--model", "OTHER"], "it was made on another model"),
        ("reward", [], "it was made by direct preference optimization, and this run is reward modeling"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(
    cli, saved: Path, tmp_path: Path, objective: str, change: list[str], difference: str
) -> None:
    made = {"EIGHT": _eight_pairs, "OTHER": _other_model}
    change = [str(made[arg](tmp_path)) if arg in made else arg for arg in change]
    before = checkpoint(saved).read_bytes()
    run = cli("tune", objective, *FLAGS, "--pairs", "ster:pairs", *change, "--output", saved, "--resume")
    assert run.code == 1, run.err
    assert run.err.splitlines()[-1] == (
        f"error: the checkpoint at {checkpoint(saved)} belongs to another run: "
        f"{difference}; run without --resume to start over"
    )
    assert checkpoint(saved).read_bytes() == before and not saved.exists()


def test_a_damaged_checkpoint_is_refused(cli, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    checkpoint(out).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    run = cli("tune", "sft", "--model", "ster:toy", "--examples", "ster:examples", "--output", out, "--resume")
    assert run.code == 1
    assert run.err.splitlines()[-1] == (
        f"error: the checkpoint at {checkpoint(out)} is not a safetensors file (its "
        "header is not JSON); run without --resume to start over"
    )


CHECK_IMPORTS = (
    "import sys; from ster.cli import main; code = main(sys.argv[1:]); "
    "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
)


def test_another_runs_checkpoint_is_refused_before_torch_is_imported(saved: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHECK_IMPORTS,
            "tune",
            "dpo",
            *FLAGS,
            "--pairs",
            "ster:pairs",
            "--output",
            str(saved),
            "--resume",
            "--seed",
            "3",
        ],
        check=False,
        cwd=REPO,
        env=PINNED,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "its --seed is 42, this run's is 3" in proc.stderr
    assert proc.stderr.splitlines()[-1] == "False"


def test_a_run_without_resume_starts_over_and_says_so(cli, saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    shutil.copyfile(checkpoint(saved), checkpoint(out))  # an earlier run's (a file of the user's is refused)
    run = cli("tune", "sft", "--model", "ster:toy", "--examples", "ster:examples", "--output", out)
    assert run.code == 0, run.err
    assert f"starting over; the checkpoint of an earlier run at {checkpoint(out)} will be replaced" in run.err
    assert files(tmp_path) == ["a.json", "a.safetensors"]
