"""What ``ster serve`` holds up to under load and faults: health answers, jobs run and cancelled, memory.

Starts a real ``ster serve`` on 127.0.0.1 (its own workspace in a temporary directory), runs one
toy job to load the model, then for ``--seconds`` keeps up, all at once, on their own threads:

* **health pollers** calling ``GET /v1/health`` back to back, each answer's latency kept;
* **readers** running toy jobs (generate, train, tune sft in turn) and reading every line;
* **slow readers** doing the same with a pause after every line;
* **vanishing clients** that go away after their first line (mostly while queued) or once their
  endless SFT job has started, so the server must cancel it; and clients that go away halfway
  through sending their body, before any job starts;
* **bad inputs**: bodies that are not JSON, a JSON array, invalid UTF-8, over 1 MiB (declared or
  chunked), missing required fields, bad values, and unknown routes, each of which must be
  answered 400 or 404 with an ``{"error": …}`` sentence.

Then it lets every client finish, waits for the server to go idle and checks that health's counts
add up (accepted = finished + cancelled + failed) and that every reader got exactly one result
line. It prints a markdown table: the most requests held open at once, health answers and their
median and maximum latency, jobs run and cancelled, faults survived, bad inputs tried, and the
server's resident memory after the warm-up job and after the load. Figures depend on the machine;
nothing is asserted on speed.

    python bench/serve_load.py --seconds 30
    python bench/serve_load.py --seconds 120 --health-clients 16 --readers 8 --vanishers 6
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOY = "ster:toy"
RIVER = "question : what is the river like ? answer :"
QUEUE_LINE = "waiting for the model"
ENDLESS = 1_000_000
"""Epochs of an SFT job that only a cancel ends."""
MIB = 1 << 20


class Tally:
    """Everything the clients saw, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.most_open = 0
        self.health_ms: list[float] = []
        self.health_failed = 0
        self.most_queued = 0
        self.running_seen = 0
        self.counts = {
            key: 0
            for key in (
                "read",
                "slow",
                "vanished queued",
                "vanished running",
                "vanished upload",
                "bad",
                "bad answered wrong",
                "one result",
                "lost or doubled",
                "client errors",
            )
        }
        self.problems: list[str] = []

    def add(self, key: str, problem: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if problem is not None and len(self.problems) < 20:
                self.problems.append(problem)

    def held(self, delta: int) -> None:
        with self.lock:
            self.open += delta
            self.most_open = max(self.most_open, self.open)


class Held:
    """Counts a request as open for as long as the block runs."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def __enter__(self) -> None:
        self.tally.held(1)

    def __exit__(self, *exc: object) -> None:
        self.tally.held(-1)


def start(workdir: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """``ster serve`` on a free port, its own workspace; its stderr read as it comes."""
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(workdir / "data"),
        "XDG_STATE_HOME": str(workdir / "state"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "ster", "serve"],
        cwd=workdir,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"ster serve did not start: {process.stderr.read()}")
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True).start()
    return process, f"http://127.0.0.1:{json.loads(line)['port']}", stderr


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stream(
    url: str,
    tally: Tally,
    path: str,
    body: dict[str, Any],
    until: Callable[[list[dict]], bool] | None = None,
    delay: float = 0.0,
) -> tuple[list[dict], bool]:
    """POST a job and read its lines; stop early (closing the connection) once ``until`` says so."""
    lines: list[dict] = []
    with Held(tally), httpx.Client(base_url=url, timeout=300) as client:
        with client.stream("POST", path, json=body) as response:
            for raw in response.iter_lines():
                if raw.strip():
                    lines.append(json.loads(raw))
                    if until is not None and until(lines):
                        return lines, True
                    if delay:
                        time.sleep(delay)
    return lines, False


def jobs(out: Path, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Toy jobs in turn, each writing its own files (an adapter's sidecar is its name with ``.json``)."""
    for n in range(1_000_000):
        yield "/v1/generate", {"model": TOY, "prompt": RIVER, "maxNewTokens": 40}
        yield "/v1/train", {"model": TOY, "pairs": "ster:pairs", "output": str(out / f"{name}-{n}-vector.json")}
        yield (
            "/v1/tune/sft",
            {
                "model": TOY,
                "examples": "ster:examples",
                "epochs": 3,
                "output": str(out / f"{name}-{n}-adapter.safetensors"),
            },
        )


def reader(url: str, tally: Tally, stop: threading.Event, out: Path, name: str, delay: float) -> None:
    kind = "slow" if delay else "read"
    for path, body in jobs(out, name):
        if stop.is_set():
            return
        try:
            lines, _ = stream(url, tally, path, body, delay=delay)
        except Exception as exc:
            tally.add("client errors", f"{path}: {exc!r}")
            continue
        tally.add(kind)
        results = [line for line in lines if line.get("type") == "result"]
        if len(results) == 1 and lines[-1] is results[0] and results[0]["status"] == 0:
            tally.add("one result")
        else:
            tally.add("lost or doubled", f"{path}: {lines[-2:]}")


def vanisher(url: str, tally: Tally, stop: threading.Event, out: Path, name: str) -> None:
    for n in range(1_000_000):
        if stop.is_set():
            return
        try:
            if n % 2 == 0:  # away after the first line: the queue line, or the first line of its job
                stream(
                    url,
                    tally,
                    "/v1/generate",
                    {"model": TOY, "prompt": RIVER, "maxNewTokens": 40},
                    until=lambda lines: True,
                )
                tally.add("vanished queued")
            else:  # away once its endless job has the model: only the server's cancel ends it
                body = {
                    "model": TOY,
                    "examples": "ster:examples",
                    "epochs": ENDLESS,
                    "output": str(out / f"{name}-{n}.safetensors"),
                }
                stream(
                    url, tally, "/v1/tune/sft", body, until=lambda lines: QUEUE_LINE not in lines[-1].get("chunk", "")
                )
                tally.add("vanished running")
        except Exception as exc:
            tally.add("client errors", f"vanisher: {exc!r}")


def upload_vanisher(url: str, tally: Tally, stop: threading.Event) -> None:
    body = json.dumps({"model": TOY, "prompt": RIVER, "maxNewTokens": 5}).encode()
    host, port = url.removeprefix("http://").split(":")
    while not stop.is_set():
        try:
            with Held(tally), socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(
                    b"POST /v1/generate HTTP/1.1\r\nhost: ster\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % len(body) + body[: len(body) // 2]
                )
            tally.add("vanished upload")
        except OSError as exc:
            tally.add("client errors", f"upload: {exc!r}")
        time.sleep(0.05)


def chunked_oversize() -> Iterator[bytes]:
    yield b"{"
    for _ in range(17):  # 1 MiB + 64 KiB without a content-length
        yield b" " * 65536


BAD: list[tuple[str, str, Callable[[], dict[str, Any]], int]] = [
    ("POST", "/v1/generate", lambda: {"content": b"not json at all"}, 400),
    ("POST", "/v1/generate", lambda: {"content": b'[{"model": "ster:toy"}]'}, 400),
    ("POST", "/v1/generate", lambda: {"content": b'{"model": "ster:toy", "prompt": "\xff\xfe"}'}, 400),
    ("POST", "/v1/train", lambda: {"content": b" " * (MIB + 1)}, 400),
    ("POST", "/v1/train", lambda: {"content": chunked_oversize()}, 400),
    ("POST", "/v1/generate", lambda: {"json": {"prompt": RIVER}}, 400),
    ("POST", "/v1/tune/sft", lambda: {"json": {"model": TOY, "examples": "ster:examples"}}, 400),
    ("POST", "/v1/generate", lambda: {"json": {"model": TOY, "prompt": RIVER, "maxNewTokens": -3}}, 400),
    (
        "POST",
        "/v1/tune/sft",
        lambda: {
            "json": {
                "model": TOY,
                "examples": "ster:examples",
                "epochs": "many",
                "output": "/nonexistent/x.safetensors",
            }
        },
        400,
    ),
    ("POST", "/v1/no-such-operation", lambda: {"json": {}}, 404),
    ("GET", "/v1/generate", lambda: {}, 404),
]
"""(method, path, httpx keyword arguments, the status every answer must have, with an error sentence)."""


def bad_inputs(url: str, tally: Tally, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for n in range(1_000_000_000):
            if stop.is_set():
                return
            method, path, kwargs, status = BAD[n % len(BAD)]
            tally.add("bad")
            try:
                with Held(tally):
                    response = client.request(method, path, **kwargs())
                error = response.json().get("error")
            except Exception as exc:
                tally.add("bad answered wrong", f"{method} {path}: {exc!r}")
                continue
            if response.status_code != status or not isinstance(error, str) or not error.strip():
                tally.add("bad answered wrong", f"{method} {path}: {response.status_code} {response.text[:120]}")


def poller(url: str, tally: Tally, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                with Held(tally):
                    body = client.get("/v1/health").json()
                ok = body.get("status") == "ok"
            except Exception as exc:
                ok, body = False, {"error": repr(exc)}
            elapsed = (time.perf_counter() - began) * 1e3
            with tally.lock:
                if not ok:
                    tally.health_failed += 1
                    continue
                tally.health_ms.append(elapsed)
                tally.most_queued = max(tally.most_queued, body["queued"])
                tally.running_seen += body["running"]


def idle(url: str, wait: float) -> dict[str, Any]:
    """Health once no job runs or waits and the counts add up (or after ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        body = httpx.get(f"{url}/v1/health", timeout=30).json()
        counts = body["jobs"]
        settled = counts["accepted"] == counts["finished"] + counts["cancelled"] + counts["failed"]
        if (body["running"] == 0 and body["queued"] == 0 and settled) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the load is kept up")
    parser.add_argument("--health-clients", type=int, default=8, help="threads polling GET /v1/health")
    parser.add_argument("--readers", type=int, default=4, help="threads running toy jobs and reading them whole")
    parser.add_argument("--slow-readers", type=int, default=2, help="threads reading their jobs slowly")
    parser.add_argument("--slow-delay", type=float, default=0.05, help="seconds a slow reader waits after each line")
    parser.add_argument("--vanishers", type=int, default=3, help="threads whose clients go away mid-stream")
    parser.add_argument("--upload-vanishers", type=int, default=1, help="threads going away mid-body")
    parser.add_argument("--bad-clients", type=int, default=2, help="threads sending refused bodies and routes")
    parser.add_argument("--drain-seconds", type=float, default=300.0, help="most time the clients get to finish")
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)

    with tempfile.TemporaryDirectory(prefix="ster-serve-load-") as tmp:
        workdir = Path(tmp)
        (workdir / "out").mkdir()
        process, url, stderr = start(workdir)
        try:
            tally = Tally()
            warm = stream(url, tally, "/v1/generate", {"model": TOY, "prompt": RIVER, "maxNewTokens": 40})[0]
            assert warm[-1]["status"] == 0, warm
            before = rss_mib(process.pid)
            counts_before = httpx.get(f"{url}/v1/health").json()["jobs"]
            stop = threading.Event()
            out = workdir / "out"
            threads = [threading.Thread(target=poller, args=(url, tally, stop)) for _ in range(args.health_clients)]
            threads += [
                threading.Thread(target=reader, args=(url, tally, stop, out, f"r{i}", 0.0)) for i in range(args.readers)
            ]
            threads += [
                threading.Thread(target=reader, args=(url, tally, stop, out, f"s{i}", args.slow_delay))
                for i in range(args.slow_readers)
            ]
            threads += [
                threading.Thread(target=vanisher, args=(url, tally, stop, out, f"v{i}")) for i in range(args.vanishers)
            ]
            threads += [
                threading.Thread(target=upload_vanisher, args=(url, tally, stop)) for _ in range(args.upload_vanishers)
            ]
            threads += [threading.Thread(target=bad_inputs, args=(url, tally, stop)) for _ in range(args.bad_clients)]
            for thread in threads:
                thread.daemon = True
                thread.start()
            print(f"load on {url} for {args.seconds:g} s with {len(threads)} client threads", file=sys.stderr)
            time.sleep(args.seconds)
            stop.set()
            ends = time.monotonic() + args.drain_seconds
            for thread in threads:
                thread.join(timeout=max(0.1, ends - time.monotonic()))
            hung = sum(thread.is_alive() for thread in threads)
            health = idle(url, wait=30.0)
            after = rss_mib(process.pid)
            answered_at_end = httpx.get(f"{url}/v1/health", timeout=30).status_code == 200
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    counts = {key: health["jobs"][key] - counts_before[key] for key in counts_before}
    c = tally.counts
    ms = tally.health_ms or [0.0]
    tracebacks = sum("Traceback" in line for line in stderr)
    rows = [
        ("seconds under load", f"{args.seconds:g}"),
        (
            "client threads (health / readers / slow / vanishing / mid-body / bad)",
            f"{args.health_clients} / {args.readers} / {args.slow_readers} / {args.vanishers} / "
            f"{args.upload_vanishers} / {args.bad_clients}",
        ),
        ("requests held open at once (most)", f"{tally.most_open}"),
        ("model jobs queued at once (most health saw)", f"{tally.most_queued}"),
        ("health requests answered (failed)", f"{len(tally.health_ms)} ({tally.health_failed})"),
        ("health latency median / max", f"{statistics.median(ms):.1f} ms / {max(ms):.1f} ms"),
        ("health answers while a job had the model", f"{tally.running_seen}"),
        (
            "jobs accepted / finished / cancelled / failed",
            f"{counts['accepted']} / {counts['finished']} / {counts['cancelled']} / {counts['failed']}",
        ),
        (
            "readers with exactly one result line (lost or doubled)",
            f"{c['one result']} of {c['read'] + c['slow']} ({c['lost or doubled']})",
        ),
        ("slow clients served", f"{c['slow']}"),
        (
            "vanished clients: after one line / once running / mid-body",
            f"{c['vanished queued']} / {c['vanished running']} / {c['vanished upload']}",
        ),
        ("bad inputs tried (answered wrong)", f"{c['bad']} ({c['bad answered wrong']})"),
        ("client errors / clients still blocked at the end", f"{c['client errors']} / {hung}"),
        (
            "idle at the end (running, queued), answering",
            f"{health['running']}, {health['queued']}, {'yes' if answered_at_end else 'no'}",
        ),
        ("tracebacks on the server's stderr", f"{tracebacks}"),
        ("server RSS after warm-up / after load", f"{before:.0f} MiB / {after:.0f} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'figure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    for problem in tally.problems:
        print(f"problem: {problem}", file=sys.stderr)


if __name__ == "__main__":
    main()
