"""A checkpoint is judged wholly before ``--resume`` uses any of it; its path is Ster's alone.

Each case takes a real checkpoint (a dpo run on the toy stopped dead after step 4 of 9), breaks one
thing in it the way damage or a hostile hand would, and resumes: the run must end with exit 1 and
one sentence naming the defect, write nothing, and leave the checkpoint as it was. A checkpoint
rewritten without a change still resumes, so what is refused is the defect and not the rewriting.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO
from tests.tune.test_resume import FLAGS, PINNED, checkpoint, killed_after_checkpoint

COMMAND = ["tune", "dpo", *FLAGS, "--pairs", "ster:pairs", "--checkpoint-every", "2"]
TAIL = "; run without --resume to start over"

Change = Callable[[dict[str, np.ndarray], dict[str, Any]], None]


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of a dpo run stopped dead after its step 4 (of 9: 3 epochs of 3 steps)."""
    out = tmp_path_factory.mktemp("original") / "a.safetensors"
    killed_after_checkpoint([*COMMAND, "--output", str(out)], step=4)
    return checkpoint(out)


def crafted(original: Path, out: Path, change: Change) -> bytes:
    """Write ``original`` changed by ``change(tensors, documents)`` as the checkpoint of ``out``; its bytes."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    tensors = dict(load_file(str(original)))
    with safe_open(str(original), "np") as handle:
        documents = {key: json.loads(value) for key, value in handle.metadata().items()}
    change(tensors, documents)
    save_file(tensors, str(checkpoint(out)), metadata={key: json.dumps(value) for key, value in documents.items()})
    return checkpoint(out).read_bytes()


def _set(where: str, key: str, value: Any) -> Change:
    return lambda tensors, documents: documents[where].__setitem__(key, value)


def _tensor(name: str, value: Any) -> Change:
    return lambda tensors, documents: tensors.__setitem__(name, value)


def _poke(name: str, value: float) -> Change:
    def change(tensors: dict[str, np.ndarray], documents: dict[str, Any]) -> None:
        tensors[name] = tensors[name].copy()
        tensors[name].flat[0] = value

    return change


def _drop(name: str) -> Change:
    return lambda tensors, documents: tensors.pop(name)


def _steps(value: float) -> Change:
    """The loop and every tensor's step count at ``value``: a checkpoint consistent with itself."""

    def change(tensors: dict[str, np.ndarray], documents: dict[str, Any]) -> None:
        documents["loop"]["step"] = int(value)
        for name in [n for n in tensors if n.endswith(".step")]:
            tensors[name] = np.array(value, dtype=np.float32)

    return change


def _stats(change_entry: Callable[[dict[str, Any]], None]) -> Change:
    def change(tensors: dict[str, np.ndarray], documents: dict[str, Any]) -> None:
        for entry in documents["loop"]["epoch_stats"]:
            change_entry(entry)

    return change


CASES: list[tuple[str, Change, str]] = [
    ("missing factor", _drop("layers.0.query.a"), "lacks the tensor layers.0.query.a, which this run's adapter has"),
    (
        "missing moment",
        _drop("optimizer.3.exp_avg"),
        "lacks the tensor optimizer.3.exp_avg, which goes with the other moments of optimizer tensor 3",
    ),
    (
        "another shape",
        _tensor("layers.0.query.a", np.zeros((8, 63), np.float32)),
        "shapes the tensor layers.0.query.a [8, 63], where this run's adapter has [8, 64]",
    ),
    (
        "another dtype",
        _tensor("layers.0.query.a", np.zeros((8, 64), np.float64)),
        "stores the tensor layers.0.query.a as F64, where Ster writes F32",
    ),
    (
        "unknown tensor",
        _tensor("extra", np.zeros(1, np.float32)),
        "holds the tensor extra, which no Ster checkpoint holds",
    ),
    ("string step", _set("loop", "step", "4"), 'gives the loop\'s step as "4", which is not a whole number'),
    ("step true", _set("loop", "step", True), "gives the loop's step as true, which is not a whole number"),
    ("negative step", _set("loop", "step", -1), "gives the loop's step as -1, below zero"),
    ("step beyond the run", _steps(1e9), "is at step 1000000000, beyond the 9 steps of this run"),
    ("steps that disagree", _set("loop", "step", 5), "gives optimizer.0.step as 4.0, where the loop has taken 5 steps"),
    ("unknown loop field", _set("loop", "extra", 1), "holds the loop field 'extra', which no Ster checkpoint has"),
    ("missing loop field", lambda t, d: d["loop"].pop("tokens"), "lacks the loop field 'tokens'"),
    (
        "unknown document",
        lambda t, d: d.__setitem__("notes", {}),
        ("holds the document 'notes', which no Ster checkpoint holds"),
    ),
    (
        "inf in a moment",
        _poke("optimizer.0.exp_avg", np.inf),
        "holds a non-finite value in the tensor optimizer.0.exp_avg",
    ),
    ("nan in a factor", _poke("layers.1.value.b", np.nan), "holds a non-finite value in the tensor layers.1.value.b"),
    (
        "negative second moment",
        _poke("optimizer.2.exp_avg_sq", -1.0),
        "holds a negative value in optimizer.2.exp_avg_sq, a running mean of squares",
    ),
    (
        "a factor that overflows",
        _poke("layers.0.query.a", 3e38),
        (
            "holds factors no adapter may hold: tensor layers.0.query.a holds 3e+38, beyond 1e+24, the largest value "
            "Ster applies without risking an f32 overflow in a forward"
        ),
    ),
    (
        "nan loss",
        _set("loop", "final_loss", float("nan")),
        "gives the loop's final_loss as nan, which is not a finite number",
    ),
    (
        "losses without a step",
        _set("loop", "first_loss", None),
        (
            "records losses that do not go with step 4 (a run has a first and a final loss once it has taken a step, and "
            "none before)"
        ),
    ),
    (
        "a number the objective reads",
        _stats(lambda entry: entry.pop("correct")),
        "lacks the number 'correct' in its per-unit numbers, which this objective reads",
    ),
    (
        "too few per-unit numbers",
        lambda t, d: d["loop"]["epoch_stats"].pop(),
        "holds 3 per-unit numbers for the epoch in progress, where step 4 implies 4",
    ),
    (
        "a lost epoch",
        lambda t, d: d["loop"]["epoch_history"].clear(),
        "holds 0 finished epochs in its history, where step 4 implies 1",
    ),
    (
        "a reference missing",
        lambda t, d: d["reference"].pop("3"),
        "lacks the reference scores of unit 3, which this run trains on",
    ),
    (
        "a reference of text",
        lambda t, d: d["reference"].__setitem__("3", ["x", 1.0]),
        "gives unit 3's reference scores as ['x', 1.0], not two finite numbers",
    ),
    ("truncated", lambda t, d: None, "is truncated"),
]


@pytest.mark.parametrize(("change", "phrase"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_damaged_checkpoint_is_refused_naming_the_defect(
    cli, original: Path, tmp_path: Path, change: Change, phrase: str
) -> None:
    out = tmp_path / "a.safetensors"
    before = crafted(original, out, change)
    if phrase == "is truncated":
        before = before[: len(before) // 2]
        checkpoint(out).write_bytes(before)
    run = cli(*COMMAND, "--output", out, "--resume")
    assert run.code == 1, run.err
    last = run.err.splitlines()[-1]
    assert last.startswith(f"error: the checkpoint at {checkpoint(out)} {phrase}") and last.endswith(TAIL), last
    assert "Traceback" not in run.err and run.out == ""
    assert checkpoint(out).read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.safetensors.checkpoint"
    ]


def test_a_checkpoint_rewritten_unchanged_still_resumes(cli, original: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    crafted(original, out, lambda tensors, documents: None)
    run = cli(*COMMAND, "--output", out, "--resume")
    assert run.code == 0, run.err
    assert "resuming after step 4 of 9" in run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.safetensors"]


def test_a_defect_the_file_shows_alone_is_refused_before_torch_is_imported(original: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    crafted(original, out, _set("loop", "step", "4"))
    probe = (
        "import sys; from ster.cli import main; code = main(sys.argv[1:]); "
        "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *COMMAND, "--output", str(out), "--resume"],
        cwd=REPO,
        env=PINNED,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1 and 'gives the loop\'s step as "4"' in proc.stderr
    assert proc.stderr.splitlines()[-1] == "False"


# --- the checkpoint's path is Ster's ------------------------------------------------------------------------


@pytest.mark.parametrize("resume", [False, True])
def test_a_users_file_at_the_checkpoint_path_is_never_replaced(cli, tmp_path: Path, resume: bool) -> None:
    out = tmp_path / "a.safetensors"
    checkpoint(out).write_text("my notes, which happen to sit here\n")
    run = cli(
        "tune",
        "sft",
        "--model",
        "ster:toy",
        "--examples",
        "ster:examples",
        "--output",
        out,
        "--checkpoint-every",
        "1",
        *(["--resume"] if resume else []),
    )
    assert run.code == 1, run.err
    if resume:
        assert run.err.splitlines()[-1].startswith(f"error: the checkpoint at {checkpoint(out)} ")
    else:
        assert run.err.splitlines()[-1] == (
            f"error: {checkpoint(out)} is where this run keeps its checkpoint, and it holds a file that is not a "
            "checkpoint of Ster's, which the run would destroy; move it or give another --output"
        )
    assert checkpoint(out).read_text() == "my notes, which happen to sit here\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors.checkpoint"]


def test_a_directory_at_the_checkpoint_path_is_refused(cli, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    checkpoint(out).mkdir()
    (checkpoint(out) / "keep.txt").write_text("mine")
    run = cli("tune", "sft", "--model", "ster:toy", "--examples", "ster:examples", "--output", out)
    assert run.code == 1 and run.err.splitlines()[-1] == (
        f"error: {checkpoint(out)} is where this run keeps its checkpoint, and it holds a directory, which the run "
        "would destroy; move it or give another --output"
    )
    assert (checkpoint(out) / "keep.txt").read_text() == "mine" and not out.exists()


def test_an_earlier_runs_checkpoint_is_replaced_and_removed(cli, original: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    shutil.copyfile(original, checkpoint(out))
    run = cli(*COMMAND, "--output", out)
    assert run.code == 0, run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.safetensors"]
