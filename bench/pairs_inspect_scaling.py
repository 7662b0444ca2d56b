"""How ``ster pairs inspect`` scales: 10,000 pairs against 40,000.

Each set is synthetic and deterministic (``random.Random(size)``): question/answer pairs
in the shape ``ster pairs synthesize`` writes, built from a made-up vocabulary of 3,000
words, with about 2% exact duplicates (re-cased and re-spaced copies of an earlier pair),
2% near-duplicate candidates (an earlier pair with one word of the negative changed; only
some land within the default 3 bits), 1% refusing negatives and 1% lopsided pairs mixed
in. A round times one ``inspect_pairs`` call with the fingerprint feature cache emptied
first, so every round starts cold; the table reports the median of three rounds and the
40k/10k ratio. Nothing compares every pair
with every other, so the ratio should stay near 4 (linear); quadratic work would make it
16. Needs only this project's own environment:

    python bench/pairs_inspect_scaling.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from ster.engine.pairs.inspect import inspect_pairs
from ster.engine.pairs.model import Pair, PairSet
from ster.engine.pairs.simhash import lanes

SYLLABLES = ["ka", "lo", "mi", "ren", "tus", "pa", "vel", "dor", "an", "shi", "qua", "bel", "no", "sta", "rum"]
REFUSALS = [
    "I'm sorry, but I can't assist with that request.",
    "As an AI language model, I cannot help with that.",
    "I must decline to answer.",
    "That goes against my guidelines.",
]


def vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    """Made-up words of two or three syllables, distinct and in a fixed order."""
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))))
    return sorted(words)


def sentence(rng: random.Random, vocab: list[str], low: int, high: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(low, high)))


def fresh_pair(rng: random.Random, vocab: list[str]) -> Pair:
    question = sentence(rng, vocab, 6, 10).capitalize() + "?"
    stem = sentence(rng, vocab, 4, 8)
    return Pair(
        positive=f"Question: {question}\nAnswer: {stem} {sentence(rng, vocab, 6, 12)}.",
        negative=f"Question: {question}\nAnswer: {stem} {sentence(rng, vocab, 6, 12)}.",
    )


def variant(rng: random.Random, vocab: list[str], pairs: list[Pair]) -> Pair:
    """An exact duplicate, a near duplicate, a refusal or a lopsided pair, in the shares the docstring gives."""
    earlier = rng.choice(pairs)
    roll = rng.random()
    if roll < 2 / 6:
        return Pair(positive=earlier.positive.upper(), negative="  " + earlier.negative.replace(" ", "   "))
    if roll < 4 / 6:
        words = earlier.negative.split(" ")
        words[-2] = rng.choice(vocab)
        return Pair(positive=earlier.positive, negative=" ".join(words))
    pair = fresh_pair(rng, vocab)
    if roll < 5 / 6:
        return Pair(positive=pair.positive, negative=pair.negative.split("Answer: ")[0] + rng.choice(REFUSALS))
    return Pair(positive=pair.positive + " " + sentence(rng, vocab, 80, 100), negative=pair.negative)


def synthetic_set(size: int) -> PairSet:
    """``size`` pairs; about 6% of them are the variants above."""
    rng = random.Random(size)
    vocab = vocabulary(rng)
    pairs: list[Pair] = []
    while len(pairs) < size:
        pairs.append(variant(rng, vocab, pairs) if pairs and rng.random() < 0.06 else fresh_pair(rng, vocab))
    return PairSet(trait_name="synthetic", pairs=pairs)


def time_inspection(pair_set: PairSet, rounds: int) -> tuple[float, dict[str, int]]:
    """Median seconds of ``rounds`` cold inspections, and the counts of the last one."""
    times = []
    for _ in range(rounds):
        lanes.cache_clear()
        start = time.perf_counter()
        report = inspect_pairs(pair_set)
        times.append(time.perf_counter() - start)
    counts = {
        "duplicates": report.duplicate_count,
        "refusals": report.refusal_count,
        "unbalanced": report.unbalanced_count,
    }
    return statistics.median(times), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,40000", help="comma list of set sizes (default 10000,40000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size; the median is reported")
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {size: time_inspection(synthetic_set(size), args.rounds) for size in sizes}
    print(f"| pairs | median s ({args.rounds} rounds) | duplicates | refusals | unbalanced |")
    print("|---:|---:|---:|---:|---:|")
    for size, (seconds, counts) in results.items():
        print(f"| {size:,} | {seconds:.2f} | {counts['duplicates']} | {counts['refusals']} | {counts['unbalanced']} |")
    if len(sizes) >= 2:
        first, last = sizes[0], sizes[-1]
        ratio = results[last][0] / results[first][0]
        print(f"\n{last // 1000}k/{first // 1000}k time ratio: {ratio:.2f} (the size ratio is {last / first:g})")


if __name__ == "__main__":
    main()
