"""A real ``ster serve`` in a subprocess on 127.0.0.1, port 0, and what tests need to talk to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

PYTHON = sys.executable
TOY = "ster:toy"
RIVER = "question : what is the river like ? answer :"


@dataclass
class Server:
    """A running server: its process, its base URL, and a client bound to it."""

    process: subprocess.Popen
    url: str
    cwd: Path
    token: str | None = None
    stderr: list[str] = field(default_factory=list)
    """What the server wrote on stderr so far, read by a thread as it comes."""
    reader: threading.Thread | None = None

    def stderr_text(self) -> str:
        """Everything the server wrote on stderr; complete once it has exited."""
        if self.process.poll() is not None and self.reader is not None:
            self.reader.join(timeout=10)
        return "".join(self.stderr)

    def client(self, **kwargs) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(60.0), **kwargs)

    def post_lines(self, path: str, body: dict | None = None, **kwargs) -> tuple[int, list[dict]]:
        """POST a body and read the whole NDJSON stream: status and parsed lines."""
        with self.client() as client:
            response = client.post(path, json=body if body is not None else {}, **kwargs)
        lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        return response.status_code, lines

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


def start_server(cwd: Path, *args: str, env: dict[str, str] | None = None, wait: float = 60.0) -> Server:
    """Start ``ster serve ARGS`` in ``cwd`` and wait for its ready line."""
    process = subprocess.Popen(
        [PYTHON, "-m", "ster", "serve", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    deadline = time.monotonic() + wait
    line = process.stdout.readline()
    if not line:
        err = process.stderr.read() if process.stderr else ""
        process.wait(timeout=10)
        raise AssertionError(f"ster serve ended without its ready line (exit {process.returncode}): {err}")
    ready = json.loads(line)
    assert ready["ready"] is True and time.monotonic() < deadline
    server = Server(process, f"http://127.0.0.1:{ready['port']}", cwd)
    _drain(server)
    return server


def _drain(server: Server) -> None:
    """Read the server's stderr as it comes into ``server.stderr``, so a full pipe can never block the server."""

    def read() -> None:
        assert server.process.stderr is not None
        for text in server.process.stderr:
            server.stderr.append(text)

    server.reader = threading.Thread(target=read, daemon=True, name="ster serve stderr")
    server.reader.start()


def stop_server(server: Server) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


def served(tmp_path_factory: pytest.TempPathFactory, name: str = "serve") -> Iterator[Server]:
    """A loopback server in its own directory and workspace, for a fixture to yield from."""
    cwd = tmp_path_factory.mktemp(name)
    home = tmp_path_factory.mktemp(f"{name}-xdg")
    env = {"XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state")}
    running = start_server(cwd, env=env)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One loopback server for a module."""
    yield from served(tmp_path_factory)
