"""Load and faults against a real ``ster serve``: every job ends once, vanished clients cancel, health never waits.

One test, two rounds of the same scenario against one server, with a hard deadline (a watchdog
kills the server when it passes, so every blocked client returns and the test fails instead of
hanging). Each round, while threads poll ``GET /v1/health`` and send refused bodies:

* a *holder* job (SFT with a million epochs) takes the model and keeps it until it is cancelled
  by its ``x-ster-job`` id, so everything below is queued behind it by state, not by timing;
* toy jobs read whole and slow readers queue behind it; clients that read their queue line and
  go away give up their place; clients that go away mid-upload never start a job;
* more endless jobs whose clients read until their job has started and then go away;
* the holder is cancelled, the queue drains, and the health counts must add up.

Afterwards the server must still serve a job as before, its memory must not have grown much from
round 1 to round 2, and its stderr (read throughout, so a full pipe never blocks it) must hold no
traceback: a client gone mid-upload once raised ``ClientDisconnect`` out of the endpoint, a
traceback each, and with stderr an unread pipe the server hung after a few dozen of them.

Nothing here asserts how fast anything is: only counts, states and the lines each client read.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.serve.conftest import RIVER, TOY, Server, start_server, stop_server

DEADLINE_S = 50.0
"""Hard limit for the whole test; the watchdog kills the server then."""
ROUNDS = 2
HEALTH_THREADS = 3
HEALTH_PER_ROUND = 300
"""Health answers each round needs at least (the pollers keep going until the round's jobs are done)."""
PAUSE_S = 0.005
"""Between one poller's health requests, and between refused bodies after the first pass: the server's
event loop shares the GIL with the job's thread, so clients that never pause would only slow the jobs."""
VANISH_QUEUED = 3
VANISH_RUNNING = 2
VANISH_UPLOAD = 4
ENDLESS = 1_000_000
"""Epochs of a job that only a cancel ends."""
QUEUE_LINE = "waiting for the model"
TOO_LARGE = "request body too large"
NOT_JSON = "request body is not valid JSON"
MIB = 1 << 20


class Deadline:
    """The test's hard limit, and when each step was reached (for the message when one is not)."""

    def __init__(self, seconds: float) -> None:
        self.began = time.monotonic()
        self.at = self.began + seconds
        self.steps: list[str] = []

    def note(self, step: str) -> None:
        self.steps.append(f"{time.monotonic() - self.began:.1f}s {step}")

    def story(self) -> str:
        return "; ".join(self.steps[-40:])

    def left(self) -> float:
        return max(0.1, self.at - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.at


class Health:
    """Health answers seen by the pollers: how many, what they said, and anything that went wrong."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = 0
        self.running_seen = 0
        self.problems: list[str] = []

    def poll(self, server: Server, stop: threading.Event, deadline: Deadline) -> None:
        with httpx.Client(base_url=server.url, timeout=deadline.left()) as client:
            while not deadline.passed() and (not stop.is_set() or self.answered < HEALTH_PER_ROUND):
                try:
                    response = client.get("/v1/health")
                    body = response.json()
                    ok = (
                        response.status_code == 200
                        and body["status"] == "ok"
                        and body["running"] in (0, 1)
                        and body["queued"] >= 0
                    )
                except Exception as exc:
                    ok, body = False, repr(exc)
                with self.lock:
                    self.answered += 1
                    if not ok:
                        self.problems.append(str(body))
                    elif body["running"] == 1:
                        self.running_seen += 1
                time.sleep(PAUSE_S)


def chunked_oversize() -> Iterator[bytes]:
    """1 MiB + 64 KiB, sent without a content-length."""
    yield b"{"
    for _ in range(17):
        yield b" " * 65536


def bad_requests(output: Path) -> list[tuple[str, str, Callable[[], dict[str, Any]], int, str | None]]:
    """(method, path, httpx keyword arguments, status, the exact error sentence or None for any sentence)."""
    sft = {"model": TOY, "examples": "ster:examples", "output": str(output)}
    return [
        ("POST", "/v1/generate", lambda: {"content": b"not json at all"}, 400, NOT_JSON),
        ("POST", "/v1/generate", lambda: {"content": b'[{"model": "ster:toy"}]'}, 400, NOT_JSON),
        ("POST", "/v1/generate", lambda: {"content": b'{"model": "ster:toy", "prompt": "\xff\xfe"}'}, 400, NOT_JSON),
        ("POST", "/v1/train", lambda: {"content": b" " * (MIB + 1)}, 400, TOO_LARGE),
        ("POST", "/v1/train", lambda: {"content": chunked_oversize()}, 400, TOO_LARGE),
        ("POST", "/v1/generate", lambda: {"json": {"prompt": RIVER}}, 400, "generate requires a model"),
        ("POST", "/v1/tune/sft", lambda: {"json": {"model": TOY, "examples": "ster:examples"}}, 400, None),
        ("POST", "/v1/generate", lambda: {"json": {"model": TOY, "prompt": RIVER, "maxNewTokens": -3}}, 400, None),
        ("POST", "/v1/tune/sft", lambda: {"json": {**sft, "epochs": "many"}}, 400, None),
        ("POST", "/v1/tune/sft", lambda: {"json": {**sft, "epochs": 0}}, 400, None),
        ("POST", "/v1/no-such-operation", lambda: {"json": {}}, 404, "unknown endpoint: POST /v1/no-such-operation"),
        ("GET", "/v1/generate", lambda: {}, 404, "unknown endpoint: GET /v1/generate"),
        ("GET", "/v2/health", lambda: {}, 404, None),
    ]


class Refusals:
    """Refused bodies sent, and every answer that was not the expected refusal."""

    def __init__(self) -> None:
        self.tried = 0
        self.wrong: list[str] = []

    def send(self, server: Server, output: Path, stop: threading.Event, deadline: Deadline) -> None:
        """Send every refused body at least once, then again until the round is over."""
        cases = bad_requests(output)
        with httpx.Client(base_url=server.url, timeout=deadline.left()) as client:
            while not deadline.passed() and (not stop.is_set() or self.tried < len(cases)):
                method, path, kwargs, status, sentence = cases[self.tried % len(cases)]
                if self.tried >= len(cases):
                    time.sleep(PAUSE_S * 4)
                self.tried += 1
                try:
                    response = client.request(method, path, **kwargs())
                    error = response.json().get("error")
                except Exception as exc:
                    self.wrong.append(f"{method} {path}: {exc!r}")
                    continue
                if response.status_code != status or not isinstance(error, str) or not error.strip():
                    self.wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
                elif sentence is not None and error != sentence:
                    self.wrong.append(f"{method} {path}: {error!r}, expected {sentence!r}")


class Client(threading.Thread):
    """One streamed job: its status, its id, every line it read, and whatever went wrong."""

    def __init__(
        self,
        server: Server,
        path: str,
        body: dict[str, Any],
        deadline: Deadline,
        stop_after: Callable[[list[dict]], bool] | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.server, self.path, self.body, self.deadline = server, path, body, deadline
        self.stop_after, self.delay = stop_after, delay
        self.status: int | None = None
        self.job_id: str | None = None
        self.lines: list[dict] = []
        self.error: str | None = None
        self.vanished = False
        self.first_line = threading.Event()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.server.url, timeout=self.deadline.left()) as client:
                with client.stream("POST", self.path, json=self.body) as response:
                    self.status, self.job_id = response.status_code, response.headers.get("x-ster-job")
                    for raw in response.iter_lines():
                        if not raw.strip():
                            continue
                        self.lines.append(json.loads(raw))
                        self.first_line.set()
                        if self.stop_after is not None and self.stop_after(self.lines):
                            self.vanished = True
                            return  # leaving both blocks closes the connection mid-stream
                        if self.delay:
                            time.sleep(self.delay)
        except Exception as exc:
            self.error = repr(exc)
        finally:
            self.first_line.set()

    def results(self) -> list[dict]:
        return [line for line in self.lines if line.get("type") == "result"]

    def queued_first(self) -> bool:
        return bool(self.lines) and QUEUE_LINE in self.lines[0].get("chunk", "")


def vanish_mid_upload(server: Server) -> None:
    """Headers and half a body, then the connection closes: no job may start, and no traceback."""
    body = json.dumps({"model": TOY, "prompt": RIVER, "maxNewTokens": 5}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/generate HTTP/1.1\r\nhost: ster\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body[: len(body) // 2]
        )


def health(server: Server) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return client.get("/v1/health").json()


def wait_for(server: Server, deadline: Deadline, what: str, predicate: Callable[[dict], bool]) -> dict:
    last: dict = {}
    while not deadline.passed():
        last = health(server)
        if predicate(last):
            deadline.note(what)
            return last
        time.sleep(0.05)
    raise AssertionError(f"deadline passed waiting for {what}; last health {last}; so far: {deadline.story()}")


def join(server: Server, threads: list[threading.Thread], deadline: Deadline, what: str) -> None:
    for thread in threads:
        thread.join(timeout=deadline.left())
        if thread.is_alive():
            seen = (thread.path, thread.lines[-2:]) if isinstance(thread, Client) else thread.name
            raise AssertionError(
                f"a {what} client was still blocked at the deadline: {seen}; health "
                f"{health(server)}; so far: {deadline.story()}"
            )
    deadline.note(f"{what} clients done")


def one_round(server: Server, out: Path, number: int, deadline: Deadline) -> dict[str, Any]:
    deadline.note(f"round {number}")
    before = health(server)["jobs"]
    stop = threading.Event()
    polls = Health()
    refusals = Refusals()
    background = [
        threading.Thread(target=polls.poll, args=(server, stop, deadline), daemon=True) for _ in range(HEALTH_THREADS)
    ]
    background.append(
        threading.Thread(
            target=refusals.send, args=(server, out / f"bad{number}.safetensors", stop, deadline), daemon=True
        )
    )
    for thread in background:
        thread.start()

    def sft(name: str, epochs: int) -> dict[str, Any]:
        return {
            "model": TOY,
            "examples": "ster:examples",
            "output": str(out / f"r{number}-{name}.safetensors"),
            "epochs": epochs,
        }

    generate = {"model": TOY, "prompt": RIVER, "maxNewTokens": 40}
    holder = Client(server, "/v1/tune/sft", sft("holder", ENDLESS), deadline)
    holder.start()
    assert holder.first_line.wait(deadline.left()) and holder.job_id, f"the holder got no stream: {holder.error}"
    wait_for(server, deadline, "the holder to take the model", lambda h: h["running"] == 1)

    readers = [
        Client(server, "/v1/generate", generate, deadline),
        Client(
            server,
            "/v1/train",
            {"model": TOY, "pairs": "ster:pairs", "output": str(out / f"r{number}-vector.json")},
            deadline,
        ),
        Client(server, "/v1/tune/sft", sft("short", 3), deadline),
        Client(server, "/v1/generate", {**generate, "maxNewTokens": 12}, deadline),
        Client(server, "/v1/tune/sft", sft("slow", 6), deadline, delay=0.02),
        Client(server, "/v1/generate", generate, deadline, delay=0.05),
    ]
    for client in readers:
        client.start()
    wait_for(server, deadline, "the readers to queue", lambda h: h["queued"] == len(readers))

    quitters = [
        Client(server, "/v1/generate", generate, deadline, stop_after=lambda lines: True) for _ in range(VANISH_QUEUED)
    ]
    for client in quitters:
        client.start()
    join(server, quitters, deadline, "vanishing")
    wait_for(
        server,
        deadline,
        "the vanished clients' places to be given up",
        lambda h: h["queued"] == len(readers) and h["jobs"]["cancelled"] - before["cancelled"] == VANISH_QUEUED,
    )

    uploads = [threading.Thread(target=vanish_mid_upload, args=(server,), daemon=True) for _ in range(VANISH_UPLOAD)]
    for thread in uploads:
        thread.start()
    join(server, uploads, deadline, "mid-upload")

    def started(lines: list[dict]) -> bool:
        return QUEUE_LINE not in lines[-1].get("chunk", "")

    runners = [
        Client(server, "/v1/tune/sft", sft(f"endless{i}", ENDLESS), deadline, stop_after=started)
        for i in range(VANISH_RUNNING)
    ]
    for client in runners:
        client.start()
    wait_for(server, deadline, "the endless jobs to queue", lambda h: h["queued"] == len(readers) + VANISH_RUNNING)

    while polls.running_seen == 0 and not deadline.passed():  # health answered while the holder had the model
        time.sleep(0.02)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        cancelled = client.post(f"/v1/jobs/{holder.job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": holder.job_id}

    join(server, [holder, *readers, *runners], deadline, "job")
    stop.set()
    join(server, background, deadline, "health or refused-body")
    after = wait_for(
        server,
        deadline,
        "every job to end",
        lambda h: (
            h["running"] == 0
            and h["queued"] == 0
            and h["jobs"]["accepted"] == sum(h["jobs"][k] for k in ("finished", "cancelled", "failed"))
        ),
    )

    for client in [holder, *readers, *quitters, *runners]:
        assert client.error is None and client.status == 200, (client.path, client.status, client.error)
    holder_results = holder.results()
    assert len(holder_results) == 1 and holder.lines[-1] is holder_results[0], holder.lines[-3:]
    assert holder_results[0]["status"] == 1 and "cancelled" in holder_results[0]["json"]["error"]
    for client in readers:
        results = client.results()
        assert len(results) == 1 and client.lines[-1] is results[0], (client.path, client.lines[-3:])
        assert results[0]["status"] == 0, (client.path, results[0])
        assert client.queued_first(), (client.path, client.lines[:2])
    assert all(r.results()[0]["json"]["text"].strip() for r in readers if r.path == "/v1/generate")
    for client in quitters:
        assert client.vanished and client.queued_first() and not client.results(), client.lines
    for client in runners:
        assert client.vanished and not client.results(), client.lines[-3:]
    for client in [holder, *runners]:
        assert not Path(client.body["output"]).exists(), "a cancelled job wrote its output"

    delta = {key: after["jobs"][key] - before[key] for key in before}
    assert delta == {
        "accepted": 1 + len(readers) + VANISH_QUEUED + VANISH_RUNNING,
        "finished": len(readers),
        "cancelled": 1 + VANISH_QUEUED + VANISH_RUNNING,
        "failed": 0,
    }, delta

    assert not polls.problems, polls.problems[:5]
    assert polls.answered >= HEALTH_PER_ROUND and polls.running_seen > 0
    assert refusals.tried >= len(bad_requests(out)) and not refusals.wrong, refusals.wrong[:5]
    return {"health": polls.answered, "refused": refusals.tried}


def test_load_and_faults(tmp_path: Path) -> None:
    deadline = Deadline(DEADLINE_S)
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir(), out.mkdir()
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state")}
    server = start_server(cwd, env=env)  # its stderr is read as it comes, into server.stderr
    watchdog = threading.Timer(deadline.left(), server.process.kill)
    watchdog.start()
    try:
        warm = server.post_lines("/v1/generate", {"model": TOY, "prompt": RIVER, "maxNewTokens": 40})
        assert warm[0] == 200 and warm[1][-1]["status"] == 0, (warm, server.process.poll(), server.stderr)
        rss = []
        for number in range(1, ROUNDS + 1):
            one_round(server, out, number, deadline)
            rss.append(server.rss_kib())

        status, lines = server.post_lines("/v1/generate", {"model": TOY, "prompt": RIVER, "maxNewTokens": 40})
        assert status == 200 and [line["type"] for line in lines].count("result") == 1, lines
        assert lines[-1]["status"] == 0 and lines[-1]["json"]["text"] == warm[1][-1]["json"]["text"]
        assert not deadline.passed()

        growth_mib = (rss[-1] - rss[0]) / 1024
        assert growth_mib < 64, f"the server grew {growth_mib:.1f} MiB between rounds ({rss} KiB)"
    finally:
        watchdog.cancel()
        code = stop_server(server)
    log = server.stderr_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert code in (0, -signal.SIGTERM), (code, log[-2000:])  # uvicorn re-raises the SIGTERM it stopped on
