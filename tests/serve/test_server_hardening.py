"""``ster serve``, ``ster request`` and ``ster --server`` against hostile or broken peers.

A real server on 127.0.0.1 with its timeouts shortened gets bodies nested 200,000 deep, clients
that send half their headers or half their body and stall, invalid HTTP, and bodies no parser
should choke on; its stderr must never show a traceback. ``ster request`` gets every kind of
unparseable body, and ``ster --server`` gets URLs that are not URLs and servers that are not Ster's.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.serve.conftest import RIVER, TOY, Server, start_server, stop_server

DEEP = "[" * 200_000 + "]" * 200_000


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A loopback server that gives a connection 1 s for its headers and a body 1 s between chunks."""
    cwd = tmp_path_factory.mktemp("impatient")
    home = tmp_path_factory.mktemp("impatient-xdg")
    env = {
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_STATE_HOME": str(home / "state"),
        "STER_SERVE_HEADER_TIMEOUT": "1",
        "STER_SERVE_BODY_TIMEOUT": "1",
    }
    server = start_server(cwd, env=env)
    yield server
    stop_server(server)
    assert "Traceback" not in server.stderr_text(), server.stderr_text()


def _raw(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _read_until_closed(sock: socket.socket, deadline: float = 20.0) -> bytes:
    """Everything the server sends until it closes the connection (failing if it has not within ``deadline`` s)."""
    sock.settimeout(deadline)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"the server kept a stalled connection open for {deadline} s")
        if not chunk:
            return data
        data += chunk


def test_a_body_nested_too_deeply_is_refused_in_one_sentence(impatient: Server) -> None:
    for body in (DEEP, '{"model": "ster:toy", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"):
        response = httpx.post(f"{impatient.url}/v1/generate", content=body.encode(), timeout=60)
        assert response.status_code == 400, response.text
        assert response.json() == {"error": "request body is not valid JSON"}
    assert httpx.get(f"{impatient.url}/v1/health").json()["status"] == "ok"


def test_a_client_that_stalls_in_its_headers_is_dropped_while_others_are_served(impatient: Server) -> None:
    stalled = _raw(impatient)
    stalled.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    assert httpx.get(f"{impatient.url}/v1/health").json()["status"] == "ok"  # others go on meanwhile
    started = time.monotonic()
    assert _read_until_closed(stalled) == b""  # closed: no request ever arrived to answer
    assert time.monotonic() - started < 20
    trickle = _raw(impatient)  # a byte now and then never resets the clock
    for byte in b"GET /v1/hea":
        try:
            trickle.sendall(bytes([byte]))
        except OSError:
            break
        time.sleep(0.2)
    assert _read_until_closed(trickle) == b""


def test_a_client_that_stalls_in_its_body_gets_408_and_is_dropped(impatient: Server) -> None:
    stalled = _raw(impatient)
    stalled.sendall(
        b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    answer = _read_until_closed(stalled)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"the request body stalled for more than 1 s" in answer
    assert httpx.get(f"{impatient.url}/v1/health").json()["jobs"]["accepted"] >= 0


def test_hostile_bytes_get_answers_and_never_a_traceback(impatient: Server) -> None:
    for raw in (
        b"GARBAGE\r\n\r\n",
        b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
        b"POST /v1/\xff\xfe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",
    ):
        sock = _raw(impatient)
        sock.sendall(raw)
        _read_until_closed(sock) if b"Content-Length: 4" not in raw else sock.recv(65536)
        sock.close()
    with httpx.Client(base_url=impatient.url, timeout=60) as client:
        for body in (
            '{"model": "ster:toy", "prompt": "\\ud800", "maxNewTokens": 2}',
            '{"model": 1e999999}',
            '{"model": "ster:toy", "prompt": "a", "maxNewTokens": 1' + "0" * 5000 + "}",
        ):
            assert client.post("/v1/generate", content=body.encode()).status_code == 400
        with client.stream("POST", "/v1/generate", json={"model": TOY, "prompt": RIVER, "maxNewTokens": 500}) as r:
            next(r.iter_lines())  # and goes away mid-stream
    time.sleep(1)
    assert "Traceback" not in impatient.stderr_text()


def test_an_exception_no_handler_expected_is_one_line_and_a_500(capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from ster.serve.app import LastResort

    async def broken(scope, receive, send):
        raise ZeroDivisionError("division by zero. More detail nobody needs")

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(LastResort(broken)({"type": "http", "method": "POST", "path": "/v1/x", "headers": []}, receive, send))
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"]) == {"error": "internal error in the server: ZeroDivisionError: division by zero"}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "ZeroDivisionError" in err


# --- the token --------------------------------------------------------------------------------------------


def test_a_weak_token_is_refused_before_the_server_binds(tmp_path: Path) -> None:
    for token in ("x", "s3cret-token-value", "a" * 64, "abababababababababababababababab"):
        (tmp_path / "token").write_text(token + "\n")
        for host in ("127.0.0.1", "0.0.0.0"):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ster",
                    "serve",
                    "--host",
                    host,
                    "--token-file",
                    str(tmp_path / "token"),
                    "--root",
                    str(tmp_path),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=60,
            )
            assert proc.returncode == 1 and proc.stdout == "", (token, proc)
            assert proc.stderr.startswith("error: the bearer token is too weak to guard a server"), proc.stderr
            assert (len(token) < 4 or token not in proc.stderr) and proc.stderr.count("\n") == 1


# --- ster request --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"nope",
        b"[1]",
        b'{"a":',
        b"\xff\xfe",
        DEEP.encode(),
        b'{"model": "ster:toy", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"n": 1' + b"0" * 5000 + b"}",
        b'{"prompt": "\\ud800", "model": "ster:toy"}',
    ],
    ids=["word", "list", "cut", "utf8", "deep", "deep-field", "huge-number", "surrogate"],
)
def test_ster_request_refuses_an_unparseable_body_with_status_2(body: bytes) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ster", "request", "generate"], input=body, capture_output=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 2, proc
    last = json.loads(proc.stdout.decode().splitlines()[-1])
    assert last["status"] == 2 and last["type"] == "result" and "\n" not in last["json"]["error"]
    assert b"Traceback" not in proc.stderr and b"Error:" not in proc.stderr


# --- ster --server ---------------------------------------------------------------------------------------------


def _ster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ster", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize(
    "url", ["nope", "ftp://127.0.0.1:8765", "http://", "http://127.0.0.1:99999", "http://[::1", "http://127.0.0.1:9"]
)
def test_a_server_url_that_is_no_url_or_reaches_nothing_is_one_sentence(url: str) -> None:
    proc = _ster("--server", url, "generate", "--model", TOY, "--prompt", "a")
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


class _NotSter(http.server.BaseHTTPRequestHandler):
    """Answers every POST the way its path asks: HTML, a 200 without a job, lines that are not events."""

    def do_POST(self) -> None:
        kind = self.path.split("/")[2].split("?")[0]
        if kind == "generate":  # a web page
            body, headers = b"<html>hello</html>", {"content-type": "text/html"}
        elif kind == "train":  # NDJSON of the wrong kind
            body, headers = b'{"hello": "world"}\n', {"content-type": "application/x-ndjson", "x-ster-job": "1"}
        else:
            self.send_error(404)
            return
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_is_not_sters_is_said_in_one_sentence() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotSter)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        for args in (
            ["generate", "--model", TOY, "--prompt", "a"],
            ["train", "--model", TOY, "--pairs", "ster:pairs", "--output", "x.json"],
            ["inspect", "x.json"],
        ):
            proc = _ster("--server", url, *args)
            assert proc.returncode == 1, proc
            assert proc.stderr == f"error: {url} is not a Ster server" + proc.stderr.split("is not a Ster server")[1]
            assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    finally:
        httpd.shutdown()
