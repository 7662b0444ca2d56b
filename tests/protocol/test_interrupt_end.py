"""Ctrl-C at the end of a command: real SIGINTs aimed at the last part of real runs.

A script that sees exit 130 assumes nothing was written, and one that sees 0 reads the
output. So whenever a SIGINT lands — during the last step, just before the output's
final rename, while the result is shown, during the interpreter's and torch's teardown —
each run must end one of two ways, and never with a traceback or death by the signal:

* 130, its output absent and no temporary left beside it;
* 0, its output complete and valid, and stdout the whole result.

A fresh interpreter spends seconds importing torch before any of that, so the runs are
forked from one process that has imported torch, transformers and Ster once (``ZYGOTE``).
Each child is a real process that runs ``python -m ster``'s own ``__main__`` with its own
argv, stdin, stdout and stderr, receives a real SIGINT, and exits through the real
finalization. Each test first times one uninterrupted run from a progress event near its
end to the exit, then spaces its signals over that stretch and a little past it, a second
SIGINT after some of them. ``test_fresh_interpreters`` repeats a few in plain
``python -m ster`` processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ster.foreground import CANCELLING, STOPPED, TOO_LATE
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork and signals")

CANCELLED = "cancelled before it finished; nothing was written"

ZYGOTE = r'''
import json, os, runpy, sys
import torch, transformers  # noqa: F401  the seconds each command spends importing, spent once here
import ster.cli, ster.console, ster.serve.request  # noqa: F401
import ster.engine.steering.direction_jobs, ster.engine.steering.generate, ster.engine.tune.train  # noqa: F401

def child(order):
    """Become ``python -m ster ARGS`` with the order's files as stdin, stdout and stderr."""
    for fd, name, flags in ((0, order["stdin"], os.O_RDONLY), (1, order["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, order["stderr"], os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(name, flags), fd)
    sys.stdin, sys.stdout, sys.stderr = open(0, closefd=False), open(1, "w", closefd=False), open(2, "w", closefd=False)
    os.chdir(order["cwd"])
    sys.argv = [sys.executable, *order["args"]]
    runpy.run_module("ster", run_name="__main__", alter_sys=True)  # its SystemExit ends this process as usual

print("ready", flush=True)
for line in sys.stdin:
    order = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(order)
    print(json.dumps({"pid": pid}), flush=True)
    print(json.dumps({"exit": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}), flush=True)
'''


@dataclass
class Ended:
    """How one run ended: its exit status, what it printed, and when the signals were sent."""

    code: int
    out: str
    err: str
    delay: float
    second: float | None

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]

    def why(self) -> str:
        second = "" if self.second is None else f" and {self.second:.3f} s more"
        return f"SIGINT {self.delay:.3f} s after the mark{second}: exit {self.code}, stderr {self.err!r}"


class Zygote:
    """One process with the heavy imports done, which forks one ``python -m ster`` at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], cwd=REPO, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._read() == "ready"

    def _read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run(
        self,
        args: list[object],
        workdir: Path,
        mark: Callable[[str], bool],
        delay: float | None,
        second: float | None = None,
        stdin: Path | None = None,
        watch: str = "out",
    ) -> tuple[Ended, float]:
        """Run ``ster ARGS`` in ``workdir``; ``delay`` s after the first line of ``watch`` that ``mark`` accepts,
        send SIGINT (and another ``second`` s later). Returns how it ended and the seconds from the mark to the
        exit."""
        out, err = workdir.parent / f"{workdir.name}.out", workdir.parent / f"{workdir.name}.err"
        order = {
            "args": [str(a) for a in args],
            "cwd": str(workdir),
            "stdout": str(out),
            "stderr": str(err),
            "stdin": str(stdin or os.devnull),
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._read())["pid"]
        marked = _wait_for(out if watch == "out" else err, mark, pid)
        if delay is not None:
            _sleep_until(marked + delay)
            _interrupt(pid)
            if second is not None:
                _sleep_until(marked + delay + second)
                _interrupt(pid)
        code = json.loads(self._read())["exit"]
        took = time.monotonic() - marked
        return Ended(code, out.read_text(), err.read_text(), delay or 0.0, second), took

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _wait_for(path: Path, mark: Callable[[str], bool], pid: int) -> float:
    """The moment a line ``mark`` accepts appears in ``path`` (polled every millisecond)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(mark(line) for line in lines):
            return time.monotonic()
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the mark never came: {path.read_text()}")


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _interrupt(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:  # it had already ended: a signal after the exit, which is fine
        pass


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    home = tmp_path_factory.mktemp("home")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_STATE_HOME": str(home / "state"),
    }
    started = Zygote(env)
    yield started
    started.close()


def moments(count: int, span: float) -> Iterator[tuple[float, float | None]]:
    """``count`` delays spaced over ``span`` (one at random inside each slice), every third with a second SIGINT."""
    for i in range(count):
        second = random.uniform(0.0, 0.3) if i % 3 == 2 else None
        yield (i + random.random()) * span / count, second


@dataclass
class Case:
    """A command, the progress line near its end that starts the clock, and what its outputs are."""

    args: list[object]
    mark: Callable[[str], bool]
    outputs: list[str]
    stdin: dict | None = None
    watch: str = "out"
    """The stream the mark is read on: ``out`` (``--json`` events) or ``err`` (plain progress lines)."""
    kept: list[str] = field(default_factory=list)
    """What a cancelled run leaves on purpose (a training run's resumable checkpoint); ``--resume`` must finish
    from it to the complete output."""
    seen: dict[int, int] = field(default_factory=dict)


def assert_one_of_two_endings(run: Ended, workdir: Path, case: Case, before: list[str]) -> None:
    """130 with nothing written, or 0 with the output complete; never a traceback, never death by the signal."""
    case.seen[run.code] = case.seen.get(run.code, 0) + 1
    assert "Traceback" not in run.err and "KeyboardInterrupt" not in run.err, run.why()
    assert run.code in (0, 130), run.why()
    left = sorted(set(os.listdir(workdir)) - set(before))
    said = [line for line in run.err.splitlines() if line in (CANCELLING, STOPPED, TOO_LATE, CANCELLED)]
    if run.code == 130:
        assert set(left) <= set(case.kept), run.why()  # neither the output nor a temporary
        assert said and said[0] == CANCELLING, run.why()
    else:
        assert left == sorted(case.outputs), run.why()
        assert CANCELLING not in said, run.why()  # 0 after "cancelling" would have broken its word


def aimed(zygote: Zygote, tmp_path: Path, case: Case, count: int, check: Callable[[Ended, Path], None]) -> None:
    """Time one uninterrupted run from the mark to the exit, then interrupt ``count`` runs across that stretch."""
    stdin = None
    if case.stdin is not None:
        stdin = tmp_path / "body.json"
        stdin.write_text(json.dumps(case.stdin))
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    whole, took = zygote.run(case.args, quiet, case.mark, None, stdin=stdin, watch=case.watch)
    assert whole.code == 0, whole.err
    check(whole, quiet)
    for i, (delay, second) in enumerate(moments(count, took * 1.2)):
        workdir = tmp_path / f"run{i}"
        workdir.mkdir()
        run, _ = zygote.run(case.args, workdir, case.mark, delay, second, stdin=stdin, watch=case.watch)
        assert_one_of_two_endings(run, workdir, case, [])
        if run.code == 130 and os.listdir(workdir):  # the checkpoint a cancelled run keeps: it must resume
            run, _ = zygote.run(
                [*case.args, "--resume"], workdir, lambda line: True, None, stdin=stdin, watch=case.watch
            )
            assert run.code == 0, run.why()
            assert sorted(os.listdir(workdir)) == sorted(case.outputs), run.why()
        if run.code == 0:
            check(run, workdir)
    print(f"{case.args[:2]}: {took:.2f} s from the mark to the exit; exits seen {case.seen}")


def progress(stage: str, text: str = "") -> Callable[[str], bool]:
    def mark(line: str) -> bool:
        if not line.startswith("{"):
            return False
        event = json.loads(line)
        return event["type"] == "progress" and event["stage"] == stage and text in event["message"]

    return mark


def the_artifact_is_the_result(run: Ended, workdir: Path) -> None:
    """The reader accepts the artifact on disk, and it agrees with the summary the last event carries."""
    from ster.engine.steering.artifact import load_artifact

    result = run.events()[-1]
    assert result["type"] == "result", run.why()
    written = json.loads((workdir / "calm.json").read_text())
    shared = set(written) & set(result["data"])
    assert len(shared) > 5 and all(written[k] == result["data"][k] for k in shared), run.why()
    load_artifact(workdir / "calm.json")


def test_ctrl_c_at_the_end_of_optimize(zygote: Zygote, tmp_path: Path) -> None:
    """From the final refit on: the refit, the rename of the artifact, the result, the teardown."""
    case = Case(
        ["--json", "optimize", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "calm.json"],
        progress("fit", "refitting"),
        ["calm.json"],
    )
    aimed(zygote, tmp_path, case, 6, the_artifact_is_the_result)


def test_ctrl_c_at_the_end_of_train(zygote: Zygote, tmp_path: Path) -> None:
    case = Case(
        ["--json", "train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "calm.json"],
        progress("fit", "layer 3"),
        ["calm.json"],
    )
    aimed(zygote, tmp_path, case, 6, the_artifact_is_the_result)


def test_ctrl_c_at_the_end_of_tune_sft(zygote: Zygote, tmp_path: Path) -> None:
    """From the last step on; the run checkpoints every step, so the checkpoint's removal is in the window too.
    A cancelled run keeps its checkpoint, as every cancelled training run does, and ``--resume`` finishes it."""

    def adapter_complete(run: Ended, workdir: Path) -> None:
        import hashlib

        result = run.events()[-1]
        assert result["type"] == "result" and result["data"]["report"]["steps"] == 2, run.why()
        sidecar = json.loads((workdir / "a.json").read_text())
        assert sidecar["train"] == result["data"]["report"], run.why()
        assert sidecar["tensors_sha256"] == hashlib.sha256((workdir / "a.safetensors").read_bytes()).hexdigest()

    case = Case(
        [
            "--json",
            "tune",
            "sft",
            "--model",
            "ster:toy",
            "--examples",
            "ster:examples",
            "--epochs",
            "2",
            "--checkpoint-every",
            "1",
            "--output",
            "a.safetensors",
        ],
        progress("train", "step 2/2"),
        ["a.json", "a.safetensors"],
        kept=["a.safetensors.checkpoint"],
    )
    aimed(zygote, tmp_path, case, 6, adapter_complete)


def test_ctrl_c_at_the_end_of_generate(zygote: Zygote, tmp_path: Path) -> None:
    """Plain output: at 0, stdout is the whole document, byte for byte an uninterrupted run's."""
    whole: list[str] = []

    def the_whole_document(run: Ended, workdir: Path) -> None:
        whole.append(whole[0] if whole else run.out)
        assert run.out == whole[0] and json.loads(run.out)["text"], run.why()

    case = Case(
        ["generate", "--model", "ster:toy", "--prompt", "the sea is", "--max-new-tokens", "6"],
        lambda line: line.startswith("generating up to"),
        [],
        watch="err",
    )
    aimed(zygote, tmp_path, case, 6, the_whole_document)


def test_ctrl_c_at_the_end_of_ster_request(zygote: Zygote, tmp_path: Path) -> None:
    """``ster request``: 130 with nothing written, or 0 with the whole stream, its last line the document."""

    def the_last_line_is_the_result(run: Ended, workdir: Path) -> None:
        from ster.engine.steering.artifact import load_artifact

        last = json.loads(run.out.splitlines()[-1])
        assert last["status"] == 0 and last["json"]["layers"], run.why()
        load_artifact(workdir / "calm.json")

    body = {"model": "ster:toy", "pairs": "ster:pairs", "output": "calm.json"}
    case = Case(["request", "train"], lambda line: "fitting caa at layer 3" in line, ["calm.json"], stdin=body)
    aimed(zygote, tmp_path, case, 6, the_last_line_is_the_result)


def test_fresh_interpreters(tmp_path: Path) -> None:
    """A few of the same signals in plain ``python -m ster`` processes, with no fork involved."""
    case = Case(
        ["--json", "optimize", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "calm.json"],
        progress("fit", "refitting"),
        ["calm.json"],
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for i, delay in enumerate((0.0, 0.05, 0.3)):
        workdir = tmp_path / f"run{i}"
        workdir.mkdir()
        out = tmp_path / f"run{i}.out"
        with out.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ster", *case.args],
                cwd=workdir,
                env=env,
                stdout=sink,
                stderr=subprocess.PIPE,
                text=True,
            )
            marked = _wait_for(out, case.mark, proc.pid)
            _sleep_until(marked + delay)
            _interrupt(proc.pid)
            _, err = proc.communicate(timeout=120)
        run = Ended(proc.returncode, out.read_text(), err, delay, None)
        assert_one_of_two_endings(run, workdir, case, [])
        if run.code == 0:
            the_artifact_is_the_result(run, workdir)
