"""Writes that a SIGKILL cuts short: what is left is reclaimed by the next run, never a live writer's.

Each crash is real: a ``python -m ster`` process is held an instant before a rename (by
``crash_site/sitecustomize.py``, which sleeps there when the environment asks it to), so its
temporary is complete and locked, and is then killed with SIGKILL, which runs no handler. Its
temporaries stay; the next run writing into that directory removes them, because their locks
died with their writer. A temporary whose writer is alive — the held process, or another
process holding one — is left as it is, and so is any name that is not of Ster's own pattern.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ster.engine.model.adapters.artifact import sidecar_path
from ster.engine.protocol import inflight
from ster.engine.protocol.files import write_atomic
from tests.conftest import REPO
from tests.tune.adapter_files import write_adapter

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")

SITE = Path(__file__).resolve().parent / "crash_site"
SFT = ["tune", "sft", "--model", "ster:toy", "--examples", "ster:examples", "--epochs", "2", "--accumulation", "4"]


def held(args: list[object], before: str) -> subprocess.Popen[str]:
    """``python -m ster ARGS``, running until it is about to rename onto a path named ``before``, and held there."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{SITE}{os.pathsep}{REPO}",
        "STER_TEST_PAUSE_BEFORE": before,
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ster", *map(str, args)],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("paused before renaming"):
            return proc
    proc.wait(timeout=60)
    pytest.fail(f"the run ended (rc {proc.returncode}) before renaming onto {before}: {''.join(seen)}")


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    if proc.stderr is not None:
        proc.stderr.close()


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def temporaries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if inflight.PATTERN.fullmatch(p.name))


def test_a_checkpoint_killed_before_its_rename_is_reclaimed_by_the_next_run(cli, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    proc = held([*SFT, "--output", out, "--checkpoint-every", "1"], before="a.safetensors.checkpoint")
    left = temporaries(tmp_path)
    assert [p.name.startswith(".a.safetensors.checkpoint.") for p in left] == [True]
    write_atomic(tmp_path / "beside.json", "{}")  # another write in the directory, while the writer lives
    assert temporaries(tmp_path) == left, "a live writer's temporary is never removed"
    kill(proc)
    assert temporaries(tmp_path) == left, "a SIGKILL runs no handler: the temporary stays"
    run = cli(*SFT, "--output", out, "--checkpoint-every", "1")
    assert run.code == 0, run.err
    assert names(tmp_path) == ["a.json", "a.safetensors", "beside.json"]


def test_a_kill_between_the_pairs_renames_leaves_a_pair_every_reader_refuses(cli, tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    assert cli(*SFT, "--output", out, "--seed", "1").code == 0  # an earlier pair at the same path
    proc = held([*SFT, "--output", out], before="a.safetensors")  # its sidecar is renamed, its tensors not yet
    kill(proc)
    assert len(temporaries(tmp_path)) == 1
    run = cli("tune", "inspect", out)
    assert run.code == 1 and run.err.splitlines()[-1].startswith(
        f"error: adapter {out} and its sidecar {sidecar_path(out)} are from two different writes"
    ), run.err
    run = cli(*SFT, "--output", out)  # the next run replaces the pair and reclaims the temporary
    assert run.code == 0, run.err
    assert names(tmp_path) == ["a.json", "a.safetensors"] and cli("tune", "inspect", out).code == 0


def test_a_model_import_killed_before_its_rename_is_reclaimed_by_the_next_import(cli, tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from tests.protocol.toy_gguf import write_toy_gguf

    source = write_toy_gguf(tmp_path / "toy.gguf")
    proc = held(["model", "import", source, "--output", tmp_path / "imported"], before="imported")
    kill(proc)
    (staging,) = temporaries(tmp_path)
    assert staging.is_dir() and (staging / "config.json").is_file()
    run = cli("model", "import", source, "--output", tmp_path / "imported")
    assert run.code == 0, run.err
    assert names(tmp_path) == ["imported", "toy.gguf"]


def test_a_merge_killed_before_its_rename_is_reclaimed_by_the_next_merge(cli, tmp_path: Path) -> None:
    adapter = tmp_path / "a.safetensors"
    write_adapter(adapter, b_scale=0.1)
    merge = ["tune", "merge", "--model", "ster:toy", "--adapter", adapter, "--output", tmp_path / "merged"]
    kill(held(merge, before="merged"))
    (staging,) = temporaries(tmp_path)
    assert (staging / "model.safetensors").is_file()
    run = cli(*merge)
    assert run.code == 0, run.err
    assert names(tmp_path) == ["a.json", "a.safetensors", "merged"]


HOLDER = """
import sys
from pathlib import Path
from ster.engine.protocol import inflight
fd, name = inflight.temp_file(prefix=".a.json.", suffix=inflight.SUFFIX, dir=sys.argv[1])
directory = inflight.temp_directory(prefix=".model.", suffix=inflight.SUFFIX, dir=sys.argv[1])
print(name, directory, flush=True)
sys.stdin.read()
"""


def test_another_live_writers_temporaries_are_left_and_reclaimed_once_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=REPO,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert holder.stdout is not None
    file, directory = map(Path, holder.stdout.readline().split())
    write_atomic(tmp_path / "a.json", "{}")  # the same destination as the holder's file
    assert file.is_file() and directory.is_dir(), "a live writer's temporaries are never removed"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    write_atomic(tmp_path / "a.json", "{}")
    assert names(tmp_path) == ["a.json"]


def test_only_names_of_sters_own_pattern_are_ever_reclaimed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("mine")
    work = tmp_path / "work"
    work.mkdir()
    kept = [".notes.tmp", ".a.json.abcdefgh.tmp", "a.ster.tmp", ".editor.swp"]
    for name in kept:
        (work / name).write_text("not Ster's")
    (work / ".link.ster.tmp").symlink_to(elsewhere / "precious")  # a link of the pattern is never followed
    (work / ".dead.json.abcdefgh.ster.tmp").write_text("a temporary no live writer holds")
    write_atomic(work / "b.json", "{}")
    assert names(work) == sorted([*kept, ".link.ster.tmp", "b.json"])
    assert (elsewhere / "precious").read_text() == "mine"
