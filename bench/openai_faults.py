"""``ster serve``'s OpenAI endpoints under load and faults: no lost or doubled chunk, no traceback, memory flat.

Starts a real ``ster serve --model M`` (the bundled ``ster:toy-chat`` by default, so it runs in seconds anywhere)
in a temporary directory with two vectors (calm, fitted there, and its opposite), works out each request's text
once, alone and unstreamed, and then for ``--seconds`` keeps up, all at once, on their own threads:

* **streamers** sending greedy streamed chat requests with one of several steering specs (none, add, ablate,
  clamp, a registered name), each stream's text checked against its reference: a lost, doubled or reordered
  chunk shows as a mismatch;
* **slow readers** doing the same with a pause after every line;
* **vanishing clients** that go away after their second chunk;
* **bad specs**: bodies with a misspelt field, an unknown mode, a missing vector, a bad scale, each of which
  must be answered 400 in OpenAI's shape naming the field;
* **a registry replacer** swapping the name ``mood`` between calm and anxious every 0.3 s, while streamers use
  ``mood``: each such text must be calm's or anxious's whole, never a mix.

Then it waits for the batch to empty and prints a markdown table: requests answered, mismatches, faults survived,
bad bodies refused, replacements, the most rows decoding at once, tracebacks on stderr, and the server's
resident memory over the first and the last third of the run. Nothing is asserted on speed.

    python bench/openai_faults.py --seconds 30
    python bench/openai_faults.py --model .bench/smollm2 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
QUESTIONS = ["the sea", "a quiet morning", "why do birds sing", "the river is", "tell me about the hill"]
BAD = [
    ({"steering": {"vector": "calm.json", "scal": 2}}, "steering[0].scal"),
    ({"steering": {"vector": "calm.json", "mode": "flip"}}, "steering[0].mode"),
    ({"steering": {"vector": "nowhere.json"}}, "steering[0].vector"),
    ({"steering": {"vector": "calm.json", "scale": "lots"}}, "steering[0].scale"),
    ({"temperature": 9}, "temperature"),
]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {
            k: 0
            for k in ("answered", "mismatched", "slow", "vanished", "bad refused", "bad answered wrong", "replaced")
        }
        self.errors: list[str] = []

    def add(self, key: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if error is not None and len(self.errors) < 5:
                self.errors.append(error)


def stream_text(url: str, body: dict[str, Any], pause: float = 0.0, stop_after: int | None = None) -> str | None:
    """The streamed text of a chat request (None when it was dropped on purpose)."""
    with (
        httpx.Client(base_url=url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response,
    ):
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}: {response.read()[:200]!r}")
        pieces, chunks, done = [], 0, False
        for line in response.iter_lines():
            if pause:
                time.sleep(pause)
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if done:
                raise RuntimeError("a chunk after [DONE]")
            pieces.append(chunk["choices"][0]["delta"].get("content") or "")
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                return None
        if not done:
            raise RuntimeError("the stream ended without [DONE]")
        return "".join(pieces)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ster:toy-chat")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--streamers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    from ster.cli import main as ster
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        model = args.model if args.model.startswith("ster:") else str(Path(args.model).resolve())
        pairs = "ster:pairs" if model.startswith("ster:") else str(ROOT / "tests" / "data" / "calm-fit.json")
        with open(where / "train.log", "w") as log:
            saved, sys.stdout = sys.stdout, log
            try:
                assert (
                    ster(["--json", "train", "--model", model, "--pairs", pairs, "--output", str(where / "calm.json")])
                    == 0
                )
            finally:
                sys.stdout = saved
        document = json.loads((where / "calm.json").read_text())
        for vector in document["vectors"]:
            vector["values"] = [-v for v in vector["values"]]
        (where / "anxious.json").write_text(json.dumps(document))
        process = subprocess.Popen(
            [sys.executable, "-m", "ster", "serve", "--model", model],
            cwd=where,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None and process.stderr is not None
        url = f"http://127.0.0.1:{json.loads(process.stdout.readline())['port']}"
        stderr: list[str] = []
        threading.Thread(target=lambda: stderr.extend(process.stderr or []), daemon=True).start()

        def rss() -> int:
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
            return 0

        specs: list[Any] = [
            None,
            {"vector": "calm.json", "scale": "0.5x"},
            {"vector": "anxious.json", "scale": "0.5x"},
            {"vector": "calm.json", "mode": "ablate"},
            {"vector": "calm.json", "mode": "clamp", "scale": "0.3x"},
        ]

        def body(question: str, spec: Any) -> dict[str, Any]:
            out = {
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": args.tokens,
                "temperature": 0,
            }
            if spec is not None:
                out["steering"] = spec
            return out

        def whole(question: str, spec: Any) -> str:
            answer = httpx.post(f"{url}/v1/chat/completions", json=body(question, spec), timeout=120).json()
            return str(answer["choices"][0]["message"]["content"])

        reference = {(q, k): whole(q, spec) for q in QUESTIONS for k, spec in enumerate(specs)}
        moods = {
            q: {
                whole(q, {"vector": "calm.json", "scale": "0.5x"}),
                whole(q, {"vector": "anxious.json", "scale": "0.5x"}),
            }
            for q in QUESTIONS
        }
        httpx.post(f"{url}/v1/steering", json={"name": "mood", "vector": "calm.json"})
        tally = Tally()
        stop = time.monotonic() + args.seconds
        memory: list[int] = []
        most_rows = 0

        def streamer(pause: float, moody: bool) -> None:
            chooser = random.Random(id(threading.current_thread()))
            while time.monotonic() < stop:
                question = chooser.choice(QUESTIONS)
                k = chooser.randrange(len(specs))
                spec = {"vector": "mood", "scale": "0.5x"} if moody else specs[k]
                try:
                    text = stream_text(url, body(question, spec), pause)
                except Exception as exc:
                    tally.add("mismatched", repr(exc))
                    continue
                right = text in moods[question] if moody else text == reference[(question, k)]
                tally.add("answered" if right else "mismatched", None if right else f"{question}/{k}: {text!r}")
                if pause:
                    tally.add("slow")

        def vanisher() -> None:
            while time.monotonic() < stop:
                try:
                    stream_text(url, body(random.choice(QUESTIONS), random.choice(specs)), stop_after=2)
                    tally.add("vanished")
                except Exception as exc:
                    tally.add("mismatched", f"vanisher: {exc!r}")

        def bad() -> None:
            while time.monotonic() < stop:
                change, param = random.choice(BAD)
                response = httpx.post(f"{url}/v1/chat/completions", json={**body("the sea", None), **change})
                error = response.json().get("error", {})
                right = (
                    response.status_code == 400 and error.get("param") == param and set(error) >= {"message", "type"}
                )
                tally.add("bad refused" if right else "bad answered wrong", None if right else response.text[:200])
                time.sleep(0.05)

        def replacer() -> None:
            flip = False
            while time.monotonic() < stop:
                flip = not flip
                vector = "anxious.json" if flip else "calm.json"
                if httpx.post(f"{url}/v1/steering", json={"name": "mood", "vector": vector}).status_code in (200, 201):
                    tally.add("replaced")
                time.sleep(0.3)

        def watch() -> None:
            nonlocal most_rows
            while time.monotonic() < stop:
                memory.append(rss())
                batch = next(iter(httpx.get(f"{url}/v1/health").json()["batches"].values()), {})
                most_rows = max(most_rows, batch.get("rows", 0))
                time.sleep(0.5)

        threads = [threading.Thread(target=streamer, args=(0.0, False)) for _ in range(args.streamers)]
        threads += [threading.Thread(target=streamer, args=(0.0, True)) for _ in range(2)]
        threads += [threading.Thread(target=streamer, args=(0.02, False)) for _ in range(2)]
        threads += [threading.Thread(target=vanisher) for _ in range(2)]
        threads += [threading.Thread(target=bad), threading.Thread(target=replacer), threading.Thread(target=watch)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = next(iter(httpx.get(f"{url}/v1/health").json()["batches"].values()), {})
            if batch.get("rows", 0) == 0 and batch.get("waiting", 0) == 0:
                break
            time.sleep(0.1)
        process.terminate()
        process.wait(timeout=60)
    third = max(1, len(memory) // 3)
    counts = tally.counts
    print(f"\n{model}, {args.seconds:.0f} s, {args.tokens} tokens a request\n")
    print("| what | count |")
    print("|---|---|")
    for key, value in counts.items():
        print(f"| {key} | {value} |")
    print(f"| most rows decoding at once | {most_rows} |")
    print(f"| tracebacks on stderr | {sum('Traceback' in line for line in stderr)} |")
    print(
        f"| resident memory, first third / last third | {statistics.mean(memory[:third]) / 1024:.0f} / "
        f"{statistics.mean(memory[-third:]) / 1024:.0f} MiB |"
    )
    for error in tally.errors:
        print(f"- {error}")


if __name__ == "__main__":
    main()
