"""``ster request OPERATION``: a body on stdin, serve's default lines on stdout, exit 0, 1, 2 or 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.serve.conftest import RIVER, TOY, Server


def request(operation: str, stdin: bytes | str, cwd: Path) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [sys.executable, "-m", "ster", "request", operation], input=data, capture_output=True, cwd=cwd, timeout=300
    )


def lines_of(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_success_prints_the_lines_serve_streams(server: Server, tmp_path: Path) -> None:
    body = {"model": TOY, "prompt": RIVER, "maxNewTokens": 5}
    done = request("generate", json.dumps(body), tmp_path)
    assert done.returncode == 0, done.stderr
    lines = lines_of(done)
    served = server.post_lines("/v1/generate", body)[1]
    assert lines[-1] == served[-1] == {"json": {"text": "the river is clear and"}, "status": 0, "type": "result"}
    assert [line["type"] for line in lines[:-1]] == ["log"] * (len(lines) - 1)
    # the same lines but the timing sentence, and the load line (the server had the model loaded already)
    chunks = [line["chunk"] for line in lines[:-1] if not line["chunk"].startswith(("generated", "loading"))]
    assert chunks == [line["chunk"] for line in served[:-1] if not line["chunk"].startswith(("generated", "loading"))]
    for raw in done.stdout.decode().splitlines():
        assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_tune_operation_writes_its_adapter(tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"
    done = request("tune/sft", json.dumps({"model": TOY, "examples": "ster:examples", "output": str(out)}), tmp_path)
    assert done.returncode == 0
    assert lines_of(done)[-1]["json"]["path"] == str(out) and out.exists()


def test_a_failure_while_running_exits_1(tmp_path: Path) -> None:
    done = request("inspect", json.dumps({"artifact": "missing.json"}), tmp_path)
    lines = lines_of(done)
    assert done.returncode == 1
    assert lines[-2] == {
        "chunk": "error: steering artifact missing.json does not exist\n",
        "stream": "stderr",
        "type": "log",
    }
    assert lines[-1] == {
        "json": {"error": "steering artifact missing.json does not exist"},
        "status": 1,
        "type": "result",
    }


def test_refusals_exit_2_with_one_line_and_no_log(tmp_path: Path) -> None:
    cases = [
        ("inspct", b"{}", "unknown operation: inspct"),
        ("generate", b'{"model":', "request body is not valid JSON: "),
        ("generate", b"[]", "request body is not valid JSON: "),
        ("generate", b"", "generate requires a model"),
        ("generate", b"  \n", "generate requires a model"),
        ("generate", json.dumps({"model": TOY}).encode(), "generate requires a prompt"),
        ("generate", json.dumps({"model": TOY, "prompt": "a", "seed": -1}).encode(), "--seed must be between"),
        (
            "train",
            json.dumps({"model": TOY, "pairs": "ster:pairs", "output": "ster:pairs"}).encode(),
            "--output ster:pairs names Ster's bundled data",
        ),
    ]
    for operation, body, sentence in cases:
        done = request(operation, body, tmp_path)
        lines = lines_of(done)
        assert done.returncode == 2, (operation, body)
        assert len(lines) == 1 and lines[0]["status"] == 2 and lines[0]["type"] == "result"
        assert lines[0]["json"]["error"].startswith(sentence), lines[0]
    assert list(tmp_path.iterdir()) == []


def test_stdout_closed_exits_1(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ster", "request", "generate"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stdout is not None and process.stdin is not None
    process.stdout.close()  # nobody reads the lines
    process.stdin.write(json.dumps({"model": TOY, "prompt": RIVER, "maxNewTokens": 3}).encode())
    process.stdin.close()
    assert process.wait(timeout=120) == 1


def test_ctrl_c_cancels_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "long.safetensors"
    body = {"model": TOY, "examples": "ster:examples", "output": str(out), "epochs": 5000}
    process = subprocess.Popen(
        [sys.executable, "-m", "ster", "request", "tune/sft"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None and process.stdin is not None
    process.stdin.write(json.dumps(body).encode())
    process.stdin.close()
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until it trains
        line = json.loads(process.stdout.readline())
        seen.append(line)
        if "epoch" in line.get("chunk", "") or "step" in line.get("chunk", ""):
            break
    process.send_signal(signal.SIGINT)
    rest = [json.loads(line) for line in process.stdout.read().decode().splitlines()]
    assert process.wait(timeout=60) == 130
    assert rest[-1]["status"] == 1 and "cancelled" in rest[-1]["json"]["error"]
    assert not out.exists()
