"""``ster --server URL <command>``: the job runs on a live server, with the output, exit codes and Ctrl-C
of a local engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.serve.conftest import RIVER, TOY, Server, start_server, stop_server


def ster(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ster", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def health(server: Server) -> dict:
    with server.client() as client:
        return client.get("/v1/health").json()


def test_the_document_equals_a_local_run(server: Server, tmp_path: Path) -> None:
    before = health(server)["jobs"]["finished"]
    args = ("generate", "--model", TOY, "--prompt", RIVER, "--max-new-tokens", "6", "--temperature", "0.8")
    remote = ster("--server", server.url, *args, cwd=tmp_path)
    local = ster(*args, cwd=tmp_path)
    assert remote.returncode == local.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert "generating up to 6 tokens" in remote.stderr
    assert health(server)["jobs"]["finished"] == before + 1


def test_json_mode_streams_the_same_events(server: Server, tmp_path: Path) -> None:
    args = ("--json", "train", "--model", TOY, "--pairs", "ster:pairs", "--layers", "2")
    remote = ster("--server", server.url, *args, "--output", str(tmp_path / "r.json"), cwd=tmp_path)
    local = ster(*args, "--output", str(tmp_path / "l.json"), cwd=tmp_path)
    remote_events = [json.loads(line) for line in remote.stdout.splitlines()]
    local_events = [json.loads(line) for line in local.stdout.splitlines()]
    progress = [
        (e["stage"], e["current"], e["total"])
        for e in remote_events
        if e["type"] == "progress" and e["stage"] != "load"
    ]  # the server may have the model loaded already
    assert progress == [
        (e["stage"], e["current"], e["total"]) for e in local_events if e["type"] == "progress" and e["stage"] != "load"
    ]
    remote_result, local_result = remote_events[-1]["data"], local_events[-1]["data"]
    assert remote_result == local_result
    assert (
        json.loads((tmp_path / "r.json").read_text())["vectors"]
        == json.loads((tmp_path / "l.json").read_text())["vectors"]
    )


def test_refusals_keep_their_exit_codes(server: Server, tmp_path: Path) -> None:
    bad = ster("--server", server.url, "generate", "--model", TOY, "--prompt", "a", "--seed", "x", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.strip() == 'error: --seed must be a whole number; got "x"'
    missing = ster("--server", server.url, "inspect", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    usage = ster("--server", server.url, "generate", "--model", TOY, cwd=tmp_path)
    assert usage.returncode == 2 and "--prompt" in usage.stderr
    gone = ster("--server", "http://127.0.0.1:9", "generate", "--model", TOY, "--prompt", "a", cwd=tmp_path)
    assert gone.returncode == 1 and "cannot reach the Ster server at http://127.0.0.1:9" in gone.stderr
    assert "Traceback" not in bad.stderr + missing.stderr + gone.stderr


def test_a_token_from_a_file_or_the_environment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-long-random-token-0123456789abcdef\n")
    guarded = start_server(tmp_path, "--token-file", str(token))
    try:
        args = ("generate", "--model", TOY, "--prompt", RIVER, "--max-new-tokens", "2")
        without = ster("--server", guarded.url, *args, cwd=tmp_path, env={"STER_TOKEN": ""})
        assert without.returncode == 1 and "requires a bearer token" in without.stderr
        assert "a-long-random-token-0123456789abcdef" not in without.stderr
        assert ster("--server", guarded.url, "--token-file", str(token), *args, cwd=tmp_path).returncode == 0
        assert (
            ster(
                "--server", guarded.url, *args, cwd=tmp_path, env={"STER_TOKEN": "a-long-random-token-0123456789abcdef"}
            ).returncode
            == 0
        )
        unreadable = ster("--server", guarded.url, "--token-file", str(tmp_path / "none"), *args, cwd=tmp_path)
        assert unreadable.returncode == 1 and unreadable.stderr.startswith("error: cannot read the token file")
    finally:
        stop_server(guarded)


def test_ctrl_c_cancels_the_job_on_the_server(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "long.safetensors"
    cancelled = health(server)["jobs"]["cancelled"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ster",
            "--server",
            server.url,
            "tune",
            "sft",
            "--model",
            TOY,
            "--examples",
            "ster:examples",
            "--output",
            str(out),
            "--epochs",
            "5000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while health(server)["running"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out_text, err_text = process.communicate(timeout=60)
    assert process.returncode == 130, err_text
    assert "cancelling" in err_text and "Traceback" not in err_text
    assert out_text == ""
    deadline = time.monotonic() + 30
    while health(server)["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    state = health(server)
    assert state["running"] == 0 and state["jobs"]["cancelled"] == cancelled + 1
    assert not out.exists()
    assert httpx.get(f"{server.url}/v1/health").status_code == 200


def test_the_client_imports_no_torch(server: Server, tmp_path: Path) -> None:
    """A laptop driving a GPU server needs neither torch nor its import time."""
    code = (
        "import sys; from ster.cli import main; "
        f"code = main(['--server', '{server.url}', 'inspect', 'missing.json']); "
        "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.split() == ["1", "False", "False"], done.stderr
