"""Steering per request under load: ``ster serve``'s OpenAI endpoints with 16 concurrent clients, beside the peers.

Starts a real ``ster serve --model M`` (SmolLM2-135M-Instruct at f32 by default) and drives it with the official
``openai`` client, every client on its own thread, streaming, each request held to exactly ``--tokens`` new
tokens (``min_tokens`` and ``max_tokens``, so every run decodes the same amount). In one run, on one machine:

1. **one client alone**, unsteered, ``--repeats`` requests one after another: the single-stream rate;
2. **16 clients at once, unsteered**: the aggregate rate, and time to first token (median, p95);
3. **16 clients at once, each with its own steering spec**: four vectors (calm and its opposite, fitted by caa
   and by pca), absolute and relative strengths, add, ablate and clamp, windows, two interventions stacked,
   and four conditional ones (CAST-style, decided on the prompt);
4. **the same 16 requests one by one to ``/v1/generate``**, today's job endpoint (a condition or a window cannot
   be said there: those rows are sent with their plain intervention);
5. **transformers' ``generate``** on the same 16 prompts as one left-padded batch, greedy, with a forward hook
   per block that edits each row by its own vector (add, or ablate/clamp of the stream after the block).

It prints the CPU line, a markdown table (tokens/s, ratio to one client, TTFT median and p95) and the memory a
row costs (the batch's KV cache per row at its peak, and the server's resident growth per row). Nothing is
asserted: the figures depend on the machine.

    python bench/openai_load.py                        # SmolLM2 from .bench/, 16 clients, 128 tokens each
    python bench/openai_load.py --model DIR --clients 16 --tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
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
sys.path.insert(0, str(ROOT / "bench"))
FIT = ROOT / "tests" / "data" / "calm-fit.json"
NEUTRAL = ROOT / "ster" / "data" / "examples" / "neutral.json"


def default_model() -> Path:
    local = ROOT / ".bench" / "smollm2"
    if local.exists():
        return local
    from decode_speed import smollm2

    return smollm2()


def fit_vectors(model: Path, where: Path) -> dict[str, Path]:
    """calm by caa and by pca on the calm pairs, and each turned around (its opposite, anxious)."""
    from ster.cli import main

    out: dict[str, Path] = {}
    for method in ("caa", "pca"):
        path = where / f"calm-{method}.json"
        argv = [
            "--json",
            "train",
            "--model",
            str(model),
            "--pairs",
            str(FIT),
            "--method",
            method,
            "--output",
            str(path),
        ]
        with open(os.devnull, "w") as quiet:
            saved, sys.stdout = sys.stdout, quiet
            try:
                assert main(argv) == 0, f"ster train --method {method} failed"
            finally:
                sys.stdout = saved
        document = json.loads(path.read_text())
        document["trait_name"] = "anxious"
        for vector in document["vectors"]:
            vector["values"] = [-v for v in vector["values"]]
        opposite = where / f"anxious-{method}.json"
        opposite.write_text(json.dumps(document))
        out[f"calm-{method}"], out[f"anxious-{method}"] = path, opposite
    return out


def specs(vectors: dict[str, Path], condition_layer: int) -> list[Any]:
    """Sixteen steering specs, no two alike."""
    c, a = str(vectors["calm-caa"]), str(vectors["anxious-caa"])
    cp, ap = str(vectors["calm-pca"]), str(vectors["anxious-pca"])

    def when(threshold: float, comparator: str = ">") -> dict[str, Any]:
        return {"vector": c, "layer": condition_layer, "threshold": threshold, "comparator": comparator}

    return [
        {"vector": c, "scale": "0.4x"},
        {"vector": a, "scale": "0.4x"},
        {"vector": cp, "scale": "0.3x"},
        {"vector": ap, "scale": "0.3x"},
        {"vector": c, "scale": "0.2x"},
        {"vector": c, "mode": "ablate"},
        {"vector": c, "mode": "clamp", "scale": "0.2x"},
        {"vector": ap, "mode": "ablate", "peak_layer": 15, "falloff": 8, "min_weight": 0.5},
        {"vector": c, "scale": "0.4x", "condition": when(0.0)},
        {"vector": a, "scale": "0.4x", "condition": when(0.0, "<")},
        [{"vector": c, "scale": "0.2x"}, {"vector": cp, "mode": "ablate"}],
        {"vector": c, "scale": "0.4x", "apply_to": "generation"},
        {"vector": c, "scale": "0.4x", "generate_first_k_tokens": 8},
        {"vector": c, "scale": 4},
        {"vector": a, "mode": "clamp", "scale": "0.1x"},
        {"vector": cp, "scale": "-0.3x", "condition": when(0.05)},
    ]


def plain(spec: Any) -> dict[str, str]:
    """The closest ``/v1/generate`` body fields to a spec (no conditions, windows or stacking there)."""
    first = spec[0] if isinstance(spec, list) else spec
    fields = {"vector": first["vector"], "mode": first.get("mode", "add")}
    if "scale" in first:
        fields["strength"] = str(first["scale"])
    for name in ("peak_layer", "falloff", "min_weight"):
        if name in first:
            fields[name.replace("_l", "L").replace("_w", "W")] = first[name]
    return fields


class Server:
    def __init__(self, model: Path, cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ster", "serve", "--model", str(model)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"ster serve did not start: {self.process.stderr.read() if self.process.stderr else ''}")
        self.url = f"http://127.0.0.1:{json.loads(line)['port']}"
        self.model = str(model)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v1/health", timeout=30).json())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def one_request(server: Server, question: str, tokens: int, spec: Any) -> dict[str, float]:
    """One client alone: the same request as :func:`one_async`, from its own client."""
    import asyncio

    import openai

    async def alone() -> dict[str, float]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600) as c:
            return await one_async(c, server.model, question, tokens, spec)

    return asyncio.run(alone())


async def one_async(client: Any, model: str, question: str, tokens: int, spec: Any) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    usage = None
    extra: dict[str, Any] = {"min_tokens": tokens}
    if spec is not None:
        extra["steering"] = spec
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None
    return {"ttft": first or 0.0, "tokens": usage.completion_tokens, "seconds": time.perf_counter() - started}


def together(server: Server, questions: list[str], tokens: int, spec_list: list[Any]) -> dict[str, Any]:
    """Every question at once, each from its own client (the official async client, one connection each)."""
    import asyncio

    import openai

    peak = {"rows": 0, "cache": 0, "rss": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            batch = next(iter(server.health()["batches"].values()), {})
            peak["rows"] = max(peak["rows"], batch.get("rows", 0))
            peak["cache"] = max(peak["cache"], batch.get("cache_bytes", 0))
            peak["rss"] = max(peak["rss"], server.rss_kib())
            time.sleep(0.2)

    async def everyone() -> list[dict[str, float]]:
        clients = [
            openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)
            for _ in questions
        ]
        try:
            return await asyncio.gather(
                *(
                    one_async(client, server.model, question, tokens, spec)
                    for client, question, spec in zip(clients, questions, spec_list, strict=True)
                )
            )
        finally:
            for client in clients:
                await client.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    busy = next(iter(server.health()["batches"].values()), {}).get("busy_seconds", 0.0)
    started, cpu = time.perf_counter(), time.process_time()
    rows = asyncio.run(everyone())
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    busy = next(iter(server.health()["batches"].values()), {}).get("busy_seconds", 0.0) - busy
    print(
        f"  the batch computed {busy:.2f} s of the {elapsed:.2f} s; the clients used {cpu:.2f} CPU-seconds of the "
        "same cores",
        flush=True,
    )
    done.set()
    watcher.join()
    ttfts = sorted(r["ttft"] for r in rows)
    return {
        "tokens": sum(r["tokens"] for r in rows),
        "seconds": elapsed,
        "ttft_median": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        "peak": peak,
    }


def via_generate(server: Server, questions: list[str], tokens: int, spec_list: list[Any]) -> dict[str, Any]:
    total, ttfts = 0, []
    started = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=600) as client:
        for question, spec in zip(questions, spec_list, strict=True):
            body = {"model": server.model, "prompt": question, "maxNewTokens": tokens, **plain(spec)}
            begun, first = time.perf_counter(), None
            with client.stream("POST", "/v1/generate?stream=events", json=body) as response:
                for line in response.iter_lines():
                    event = json.loads(line)
                    if event.get("type") == "token" and first is None:
                        first = time.perf_counter() - begun
                    if event.get("type") == "result":
                        total += event["data"]["tokens"]
                    if event.get("type") == "error":
                        raise SystemExit(f"/v1/generate refused {body}: {event['message']}")
            ttfts.append(first or 0.0)
    ttfts.sort()
    return {
        "tokens": total,
        "seconds": time.perf_counter() - started,
        "ttft_median": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
    }


def transformers_hooks(model_dir: Path, questions: list[str], tokens: int, spec_list: list[Any]) -> dict[str, Any]:
    """transformers' generate, one left-padded batch, a forward hook per block editing each row by its own vector."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    layers = model.model.layers
    width = model.config.hidden_size
    count = len(spec_list)
    # per block: an addition [R, D], a unit direction [R, D], a weight [R] and a target [R] per row
    adds = torch.zeros(len(layers), count, width)
    directions = torch.zeros(len(layers), count, width)
    weights = torch.zeros(len(layers), count)
    targets = torch.zeros(len(layers), count)
    for row, spec in enumerate(spec_list):
        first = spec[0] if isinstance(spec, list) else spec
        document = json.loads(Path(first["vector"]).read_text())
        vectors = {v["layer"]: v for v in document["vectors"]}
        scale = first.get("scale", 1)
        mode = first.get("mode", "add")
        for layer in range(len(layers)):
            nearest = min(vectors, key=lambda k, layer=layer: (abs(k - layer), k))
            entry = vectors[nearest]
            unit = torch.tensor(entry["values"], dtype=torch.float32)
            unit = unit / unit.norm()
            amount = (
                float(str(scale)[:-1]) * entry.get("activation_spread", entry["activation_norm"])
                if str(scale).endswith("x")
                else float(scale)
            )
            if mode == "add" and layer in vectors:
                adds[layer, row] = amount * unit
            elif mode != "add":
                directions[layer, row] = unit
                weights[layer, row] = 1.0
                targets[layer, row] = 0.0 if mode == "ablate" else amount

    active = torch.ones(count, dtype=torch.bool)

    def hook_for(layer: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            hidden = output[0] if isinstance(output, tuple) else output
            rows = hidden.shape[0]
            direction = directions[layer, :rows, None, :]
            along = (hidden * direction).sum(-1, keepdim=True)
            moved = weights[layer, :rows, None, None] * (targets[layer, :rows, None, None] - along)
            hidden = hidden + moved * direction + adds[layer, :rows, None, :]
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    handles = [layer.register_forward_hook(hook_for(k)) for k, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            out = model.generate(
                **batch,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            elapsed = time.perf_counter() - started
    finally:
        for handle in handles:
            handle.remove()
    del active
    generated = (out.shape[1] - batch["input_ids"].shape[1]) * count
    return {"tokens": generated, "seconds": elapsed, "ttft_median": None, "ttft_p95": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4, help="requests the lone client sends, one after another")
    parser.add_argument("--condition-layer", type=int, default=15)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    model = (args.model or default_model()).resolve()
    questions = json.loads(NEUTRAL.read_text())["prompts"][: args.clients]
    questions = [q if isinstance(q, str) else q["prompt"] for q in questions]
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        print(f"fitting four vectors on {model.name} ...", flush=True)
        vectors = fit_vectors(model, where)
        spec_list = (specs(vectors, args.condition_layer) * 4)[: args.clients]
        server = Server(model, where)
        try:
            one_request(server, questions[0], 4, None)  # loads the model and warms the kernels
            idle = server.rss_kib()
            rows: list[tuple[str, dict[str, Any]]] = []
            alone = [one_request(server, questions[k], args.tokens, None) for k in range(args.repeats)]
            single = {
                "tokens": sum(r["tokens"] for r in alone),
                "seconds": sum(r["seconds"] for r in alone),
                "ttft_median": statistics.median(r["ttft"] for r in alone),
                "ttft_p95": max(r["ttft"] for r in alone),
            }
            rows.append(("1 client alone, unsteered", single))
            print("16 unsteered ...", flush=True)
            rows.append(
                (f"{args.clients} clients, unsteered", together(server, questions, args.tokens, [None] * args.clients))
            )
            print("16 steered ...", flush=True)
            steered = together(server, questions, args.tokens, spec_list)
            rows.append((f"{args.clients} clients, {args.clients} different steering specs", steered))
            print("one by one to /v1/generate ...", flush=True)
            rows.append(
                (
                    f"the same {args.clients}, one by one to /v1/generate",
                    via_generate(server, questions, args.tokens, spec_list),
                )
            )
            peak = steered["peak"]
        finally:
            server.stop()
        if not args.skip_transformers:
            print("transformers generate with hooks ...", flush=True)
            rows.append(
                (
                    f"transformers generate, {args.clients} rows batched, a hook per block",
                    transformers_hooks(model, questions, args.tokens, spec_list),
                )
            )
    base = single["tokens"] / single["seconds"]
    print()
    print(f"{model.name}, f32, {args.tokens} new tokens a request, greedy, torch threads {os.cpu_count()}\n")
    print("| run | tokens | seconds | tokens/s | × one client | TTFT median | TTFT p95 |")
    print("|---|---|---|---|---|---|---|")
    for label, row in rows:
        rate = row["tokens"] / row["seconds"]
        median = "" if row["ttft_median"] is None else f"{row['ttft_median']:.2f} s"
        p95 = "" if row["ttft_p95"] is None else f"{row['ttft_p95']:.2f} s"
        print(
            f"| {label} | {row['tokens']} | {row['seconds']:.1f} | {rate:.1f} | {rate / base:.2f} | {median} | {p95} |"
        )
    unsteered_rate = rows[1][1]["tokens"] / rows[1][1]["seconds"]
    steered_rate = steered["tokens"] / steered["seconds"]
    print(f"\nsteered / unsteered at {args.clients} clients: {steered_rate / unsteered_rate:.3f}")
    rows_at_peak = max(peak["rows"], 1)
    print(
        f"memory: KV cache {peak['cache'] / rows_at_peak / 2**20:.2f} MiB a row at its peak of {peak['rows']} rows "
        f"(storage included); resident growth {(peak['rss'] - idle) / 1024 / rows_at_peak:.1f} MiB a row"
    )


if __name__ == "__main__":
    main()
