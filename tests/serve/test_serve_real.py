"""``ster serve`` on SmolLM2-135M-Instruct: what a user drives remotely is what the CLI computes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.real
PROMPT = "Describe a river in one sentence."


def test_generate_and_a_steered_run_equal_the_cli(smol: Path, tmp_path: Path) -> None:
    server: Server = start_server(tmp_path, "--root", str(smol.parent))  # the model named relative to the root
    try:
        body = {"model": smol.name, "prompt": PROMPT, "maxNewTokens": 12}
        status, lines = server.post_lines("/v1/generate", body)
        assert status == 200 and lines[-1]["status"] == 0
        local = subprocess.run(
            [
                sys.executable,
                "-m",
                "ster",
                "generate",
                "--model",
                str(smol),
                "--prompt",
                PROMPT,
                "--max-new-tokens",
                "12",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert lines[-1]["json"]["text"] == json.loads(local.stdout)["text"]
        # a second job reuses the loaded model
        status, again = server.post_lines("/v1/generate?stream=events", body)
        assert not any(e["type"] == "progress" and e["stage"] == "load" for e in again)
        assert again[-1]["data"]["text"] == lines[-1]["json"]["text"]
    finally:
        stop_server(server)
