"""Ctrl-C as a terminal sends it: a real SIGINT to a real ``python -m ster`` process.

Each run waits until the job has visibly started (a token, or a progress event of the
stage that does the work), waits a random moment more, and interrupts. Whatever the
moment, the process must say one line, end with the ``cancelled`` event, exit 130 and
leave nothing behind: no output and no temporary. The runs repeat so that a race
between the signal and the worker (the bug this guards against aborted with 134 or
ended in an IndexError traceback) has many chances to show.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ster.cli import main
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.foreground import CANCELLING, INTERRUPTED, STOPPED
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

LONG = ["--max-new-tokens", "2000"]
"""On the endless toy (see ``workdir``) greedy decoding runs to every one of these tokens, so a run
interrupted after its first token has most of its work ahead on any machine."""

CANCELLED = "cancelled before it finished; nothing was written"


@dataclass
class Interrupted:
    code: int
    events: list[dict]
    err: list[str]
    delay: float

    def why(self) -> str:
        return f"after {self.delay:.3f} s: exit {self.code}, stderr {self.err}, last events {self.events[-2:]}"


def spawn(*command: object) -> subprocess.Popen[str]:
    """Start a child; a child still running after four minutes is killed, failing the test instead of hanging it."""
    proc = subprocess.Popen(
        [sys.executable, *map(str, command)], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    watchdog = threading.Timer(240, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    return proc


def interrupt_at_line(proc: subprocess.Popen[str], ready: Callable[[str], bool], before: str) -> str:
    """Read the child's stderr until a line is ``ready`` (failing, as ``before`` says, if it ends first), send
    SIGINT, and wait (at most two minutes) for it to exit; its remaining stderr."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if ready(line):
            break
    else:
        pytest.fail(f"the run ended before {before}: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return err


def start(*args: object) -> subprocess.Popen[str]:
    return spawn("-m", "ster", "--json", *args)


def interrupt(
    proc: subprocess.Popen[str], ready: Callable[[dict], bool], delay: float, second_after: float | None = None
) -> Interrupted:
    """Read events until ``ready``, wait ``delay``, send SIGINT (and a second one if asked), collect the rest."""
    assert proc.stdout is not None
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if ready(events[-1]):
            break
    else:
        pytest.fail(f"the job ended before it was ready to interrupt: {events[-1:]} {proc.stderr.read()}")
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    if second_after is not None:
        time.sleep(second_after)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    events += [json.loads(line) for line in out.splitlines()]
    return Interrupted(proc.returncode, events, err.splitlines(), delay)


def assert_cancelled(run: Interrupted, leftovers: list[str]) -> None:
    assert run.code == 130, run.why()
    assert run.events[-1] == {"type": "error", "kind": "cancelled", "message": CANCELLED, "details": None}, run.why()
    assert run.err == [CANCELLING], run.why()
    assert leftovers == [], run.why()


def token(event: dict) -> bool:
    return event["type"] == "token"


def stage(name: str) -> Callable[[dict], bool]:
    return lambda event: event["type"] == "progress" and event["stage"] == name


def endless_toy(target: Path) -> Path:
    """The toy checkpoint with a 4096-position context and an end-of-text logit pinned at 0, so that
    greedy decoding never stops early: a long job on a tiny model."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(TOY_DIR, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    weights = load_file(str(target / "model.safetensors"))
    weights["lm_head.weight"][config["eos_token_id"]] = 0.0
    save_file(weights, str(target / "model.safetensors"))
    return target


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The endless toy, a vector fitted on it, a prompt file, and a 1200-pair set (the example set, 100 times)."""
    root = tmp_path_factory.mktemp("interrupt")
    endless_toy(root / "endless")
    pairs = json.loads((EXAMPLES_DIR / "pairs.json").read_text())
    (root / "pairs.json").write_text(json.dumps({**pairs, "pairs": pairs["pairs"] * 100}))
    (root / "prompts.json").write_text(json.dumps({"prompts": ["the sea is", "question : tell me about the town ."]}))
    code = main(
        [
            "train",
            "--model",
            str(root / "endless"),
            "--pairs",
            str(EXAMPLES_DIR / "pairs.json"),
            "--layers",
            "2",
            "--output",
            str(root / "calm.json"),
        ]
    )
    assert code == 0
    return root


def contents(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_endless_toy_runs_long(cli, workdir: Path) -> None:
    """The premise of the generate and sweep runs below: greedy decoding on the endless toy does not stop early."""
    run = cli("generate", "--model", workdir / "endless", "--prompt", "the sea is", "--max-new-tokens", "300")
    assert run.code == 0 and run.json["stop_reason"] == "max_new_tokens", run.err


@pytest.mark.parametrize("attempt", range(5))
def test_ctrl_c_during_generate(attempt: int, workdir: Path) -> None:
    proc = start("generate", "--model", workdir / "endless", "--prompt", "the sea is", *LONG)
    assert_cancelled(interrupt(proc, token, random.uniform(0, 0.2)), [])


def test_ctrl_c_without_json_says_two_sentences(workdir: Path) -> None:
    """Plain output: the Ctrl-C line, then the job's own ending; stdout (data only) stays empty."""
    proc = spawn("-m", "ster", "generate", "--model", workdir / "endless", "--prompt", "the sea is", *LONG)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("generating up to 2000 tokens"):
            break
    time.sleep(random.uniform(0, 0.2))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    assert (proc.returncode, out, err.splitlines()) == (130, "", [CANCELLING, CANCELLED])


@pytest.mark.parametrize("attempt", range(3))
def test_ctrl_c_during_sweep(attempt: int, workdir: Path) -> None:
    before = contents(workdir)
    proc = start(
        "sweep",
        "--model",
        workdir / "endless",
        "--vector",
        workdir / "calm.json",
        "--prompts",
        workdir / "prompts.json",
        "--strengths=-4,-2,2,4",
        *LONG,
    )
    run = interrupt(proc, token, random.uniform(0, 0.2))
    assert_cancelled(run, sorted(set(contents(workdir)) - set(before)))


@pytest.mark.parametrize("attempt", range(5))
def test_ctrl_c_during_optimize(attempt: int, workdir: Path, tmp_path: Path) -> None:
    proc = start(
        "optimize",
        "--model",
        "ster:toy",
        "--pairs",
        workdir / "pairs.json",
        "--batch-size",
        "1",
        "--output",
        tmp_path / "calm.json",
    )
    assert_cancelled(interrupt(proc, stage("read"), random.uniform(0, 0.1)), contents(tmp_path))


@pytest.fixture(scope="module")
def toy_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    from tests.protocol.toy_gguf import write_toy_gguf

    return write_toy_gguf(tmp_path_factory.mktemp("gguf") / "toy.gguf")


@pytest.mark.parametrize("attempt", range(2))
def test_ctrl_c_during_model_import(attempt: int, toy_gguf: Path, tmp_path: Path) -> None:
    proc = start("model", "import", toy_gguf, "--output", tmp_path / "toy")
    assert_cancelled(interrupt(proc, stage("dequantize"), random.uniform(0, 0.3)), contents(tmp_path))


def test_the_toy_gguf_imports(cli, toy_gguf: Path, tmp_path: Path) -> None:
    """The premise of the import runs above: uninterrupted, the same command succeeds."""
    run = cli("model", "import", toy_gguf, "--output", tmp_path / "toy")
    assert run.code == 0, run.err
    assert run.json["tensors"] == 39 and run.json["num_hidden_layers"] == 4


def test_a_second_ctrl_c_stops_at_once(toy_gguf: Path, tmp_path: Path) -> None:
    """The second interrupt lands while transformers is still reading the GGUF (seconds on the toy)."""
    proc = start("model", "import", toy_gguf, "--output", tmp_path / "toy")
    run = interrupt(proc, stage("dequantize"), 0.0, second_after=0.3)
    assert run.code == 130, run.why()
    assert run.events[-1]["kind"] == "cancelled" and run.events[-1]["message"] in (STOPPED, CANCELLED), run.why()
    assert run.err[0] == CANCELLING and not any("Traceback" in line for line in run.err), run.why()
    assert contents(tmp_path) == [], run.why()


BUSY_IMPORT = '''
import sys, time
from ster.engine.protocol import jobs
from ster.engine.protocol.files import atomic_directory

def busy(request, ctx):
    """Stage a directory, then stay inside one step that never checks the cancel flag."""
    with atomic_directory(request.output) as staging:
        (staging / "half.bin").write_bytes(b"x" * 1000)
        ctx.progress("write", "writing")
        while True:
            time.sleep(0.01)

jobs.JOBS["model import"] = ("__main__:busy", jobs.JOBS["model import"][1])
from ster.cli import main
sys.exit(main(sys.argv[1:]))
'''


def test_a_second_ctrl_c_removes_the_write_in_flight(tmp_path: Path) -> None:
    """A job stuck inside one step ignores the first Ctrl-C; the second exits, and its temporary goes too."""
    source = tmp_path / "m.gguf"
    source.write_bytes(b"unused")
    proc = spawn("-c", BUSY_IMPORT, "--json", "model", "import", source, "--output", tmp_path / "out")
    run = interrupt(proc, stage("write"), 0.0, second_after=0.5)
    assert run.code == 130, run.why()
    assert run.events[-1] == {"type": "error", "kind": "cancelled", "message": STOPPED, "details": None}, run.why()
    assert run.err == [CANCELLING], run.why()
    assert contents(tmp_path) == ["m.gguf"], run.why()


SELF_INTERRUPT = """
import os, signal, sys
import ster.cli

def interrupted_while_checking(args):
    os.kill(os.getpid(), signal.SIGINT)
    return checking(args)

checking, ster.cli._request = ster.cli._request, interrupted_while_checking
sys.exit(ster.cli.main(sys.argv[1:]))
"""


def test_ctrl_c_before_the_job_starts(tmp_path: Path) -> None:
    """SIGINT while the request is being checked (its modules imported): one line, 130, nothing written."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SELF_INTERRUPT,
            "optimize",
            "--model",
            "ster:toy",
            "--output",
            str(tmp_path / "calm.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, INTERRUPTED + "\n", "")
    assert contents(tmp_path) == []


@pytest.mark.parametrize("attempt", range(3))
def test_ctrl_c_during_startup(attempt: int, tmp_path: Path) -> None:
    """SIGINT at a random moment while the CLI imports and parses: exit 130 and one line, never a traceback."""
    proc = spawn(
        "-X",
        "importtime",
        "-m",
        "ster",
        "--json",
        "optimize",
        "--model",
        "ster:toy",
        "--pairs",
        EXAMPLES_DIR / "pairs.json",
        "--output",
        tmp_path / "calm.json",
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # -X importtime reports each module as its import completes
        if line.rstrip().endswith(" ster.cli"):
            break
    delay = random.uniform(0, 0.3)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    why = f"after {delay:.3f} s: exit {proc.returncode}, stderr {said}"
    assert proc.returncode == 130, why
    assert said in ([INTERRUPTED], [CANCELLING]), why  # before the job, or (a slow start) just inside it
    assert contents(tmp_path) == [], why
    if said == [CANCELLING]:
        assert json.loads(out.splitlines()[-1])["kind"] == "cancelled", why
