"""GRPO training speed and memory: ``ster tune grpo`` against TRL's ``GRPOTrainer`` with PEFT.

Both sides train SmolLM2-135M-Instruct at f32 on the CPU with the same LoRA configuration
(rank 8, alpha 16, q_proj and v_proj on every layer, dropout 0) on the same prompts
(bench/data/grpo-prompts.json: 8 short chat prompts, each rendered under the model's chat
template with the assistant turn opened), one iteration, one optimizer step per prompt
(Ster ``--accumulation 1``; TRL ``per_device_train_batch_size=4`` with ``num_generations=4``,
so a generation batch is the 4 completions of one prompt, ``gradient_accumulation_steps=1``,
``num_iterations=1``), a group of 4 completions of at most 32 tokens sampled at temperature
0.9 with top-p 0.95, the KL term on (beta 0.04; TRL's reference is the same model with the
adapter disabled, its default with a PEFT config), learning rate 1e-4, and 2 threads
(``OMP_NUM_THREADS`` and ``torch.set_num_threads``). The reward is the completion's length in
tokens (its EOS not counted): Ster's ``--reward length``, and for TRL a reward function that
counts the same. TRL runs with ``loss_type="grpo"`` (a completion's token mean, then the mean
over the group: Ster's loss), ``scale_rewards="group"`` (standardised within the group),
``mask_truncated_completions=False``, gradient checkpointing off, f32 (``bf16=False``),
without vLLM (``transformers``' ``generate``), and its default clipping (which does nothing on
one on-policy step: the ratio is 1).

Every measurement runs in its own fresh subprocess, so its peak resident memory is its
own (``os.wait4``'s ``ru_maxrss``); sides alternate which goes first in every round, and
the table reports medians over the rounds. What is timed, per side:

* ``s per group``: the training call alone, after the model is loaded, divided by the
  prompt groups (one optimizer step each). Ster: ``run_job`` of the ``tune grpo`` job on a
  decoder already mapped (it encodes the prompts, draws the adapter, samples, scores,
  trains and writes the adapter). TRL: ``trainer.train()`` on a trainer already built
  (building it wraps the model in PEFT; reported apart as ``setup s``).
* ``completion tokens/s``: the tokens sampled (EOS not counted) over the training call.
* the split of a group's time, measured in the workers only (wrapping functions, nothing
  in the project changes): ``sample`` is the group's decoding (Ster:
  ``decode_group``; TRL: ``_generate_single_turn``, transformers' ``generate``); for Ster
  also ``policy fwd`` (the adapted forward over prompt plus completions packed as a prefix
  tree, and its log-probabilities), ``reference`` (the same with adapters off, no
  gradient) and ``backward``; ``rest`` is the remainder (optimizer step, bookkeeping; for
  TRL everything but sampling).
* ``process s``: the whole subprocess, interpreter start and imports included;
  ``cpu s``: user + system CPU seconds of the training call.

TRL is not a project dependency. Give it its own environment (the CPU build of torch is
pinned so that pip does not fetch a CUDA one):

    python3 -m venv /work/trl-venv
    /work/trl-venv/bin/pip install torch==2.13.0 transformers==5.24.0 trl==1.16.0 peft==0.21.2 \\
        datasets==5.2.0 accelerate==1.15.0

then, from the repository root, with the project's environment active:

    python bench/grpo_speed.py --model /work/smol --trl-python /work/trl-venv/bin/python

``--model`` is a checkpoint directory that both Ster and ``transformers`` load (a Hugging
Face SmolLM2-135M-Instruct download, or ``ster model import`` of its GGUF).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workers import ROOT, environment, median, run_worker, spread  # bench/, the script's folder

PROMPTS = Path(__file__).resolve().parent / "data" / "grpo-prompts.json"

RANK, ALPHA, TARGETS = 8, 16, ("q_proj", "v_proj")
GROUP, MAX_NEW_TOKENS, TEMPERATURE, TOP_P, BETA, LEARNING_RATE, SEED = 4, 32, 0.9, 0.95, 0.04, 1e-4, 42
PARTS = ("sample", "policy", "reference", "backward")


# ---------------------------------------------------------------- the driver (project python)


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    trl = median(results["trl"], "per_group_s") if results.get("trl") else None
    lines = [
        "| side | s per group (range) | TRL / side | train s | cpu s | completion tokens per group "
        "| completion tokens/s | sample s | policy fwd s | reference s | backward s | rest s "
        "| setup s | load s | process s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side, runs in results.items():
        per = median(runs, "per_group_s")
        ratio = f"{trl / per:.2f}x" if trl and side != "trl" else ""
        parts = [
            f"{median(runs, part + '_s') / runs[0]['groups']:.2f}" if part + "_s" in runs[0] else "-" for part in PARTS
        ]
        groups = runs[0]["groups"]
        lines.append(
            f"| {side} | {per:.2f} ({spread(runs, 'per_group_s')}) | {ratio} | {median(runs, 'train_s'):.1f} "
            f"| {median(runs, 'train_cpu_s'):.1f} | {median(runs, 'completion_tokens') / groups:.1f} "
            f"| {median(runs, 'tokens_per_s'):.1f} | {' | '.join(parts)} "
            f"| {median(runs, 'rest_s') / groups:.2f} | {median(runs, 'setup_s'):.1f} "
            f"| {median(runs, 'load_s'):.1f} | {median(runs, 'process_s'):.1f} "
            f"| {max(r['peak_rss_mib'] for r in runs):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("/work/smol"), help="a checkpoint directory both load")
    parser.add_argument("--trl-python", default="/work/trl-venv/bin/python", help="the TRL environment's python")
    parser.add_argument("--python", default=sys.executable, help="the project environment's python (Ster)")
    parser.add_argument(
        "--also-ster",
        type=Path,
        metavar="DIR",
        help="a second checkout of the project whose ster runs as a third side, ster@DIR",
    )
    parser.add_argument("--no-trl", action="store_true", help="measure only the Ster side(s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8, help="train on the first N prompts (a smoke test)")
    parser.add_argument("--results", type=Path, help="also write every measurement here as JSON")
    parser.add_argument("--worker", metavar="SIDE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.model.resolve(), args.threads, args.prompts)), flush=True)
        return
    # the parent prints the machine; a worker may run in a peer's environment, which lacks Ster
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    sides: dict[str, tuple[str, Path | None]] = {"ster": (args.python, ROOT)}
    if args.also_ster:
        sides[f"ster@{args.also_ster}"] = (args.python, args.also_ster.resolve())
    if not args.no_trl:
        sides["trl"] = (args.trl_python, None)
    results: dict[str, list[dict[str, Any]]] = {}
    worker_args = ["--model", str(args.model), "--threads", str(args.threads), "--prompts", str(args.prompts)]
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for side in order:
            python, root = sides[side]
            result = run_worker(
                __file__,
                python,
                ["--worker", "trl" if root is None else "ster", *worker_args],
                environment(args.threads, root),
            )
            results.setdefault(side, []).append(result)
            loads.append(os.getloadavg()[0])
            print(
                f"round {round_ + 1} {side}: {result['per_group_s']:.2f} s per group, "
                f"train {result['train_s']:.1f} s, {result['tokens_per_s']:.1f} completion tokens/s, "
                f"peak {result['peak_rss_mib']:.0f} MiB, "
                f"load average {loads[-1]:.1f}",
                file=sys.stderr,
                flush=True,
            )
    versions = {side: runs[0]["versions"] for side, runs in results.items()}
    print(table(results))
    command = " ".join(["python", "bench/grpo_speed.py", *sys.argv[1:]])
    print(
        f"\n`{command}`; versions: {json.dumps(versions)}; {args.rounds} rounds, {args.threads} threads, "
        f"{args.prompts} prompts, group {GROUP}, {MAX_NEW_TOKENS} tokens; 1-minute load average "
        f"{loads[0]:.1f} at the start, {statistics.median(loads):.1f} median, {loads[-1]:.1f} at the end"
    )
    if args.results:
        args.results.write_text(json.dumps({"results": results, "versions": versions, "loads": loads}, indent=1))


# ---------------------------------------------------------------- Ster's worker (project python)


class Clock:
    """Seconds spent in wrapped functions, by part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, function: Any, part: Any) -> Any:
        """``function`` timed under ``part`` (a name, or a callable of the call's arguments giving one)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            name = part(*args, **kwargs) if callable(part) else part
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

        return timed


def ster_worker(model: Path, threads: int, count: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    import ster
    import ster.engine.tune.grpo as grpo
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext, build_job_request, run_job

    versions = {"ster": ster.__version__, "torch": torch.__version__}
    scratch = Path(tempfile.mkdtemp(prefix="grpo-speed-"))
    (scratch / "prompts.json").write_text(json.dumps({"prompts": prompts(count)}))
    request = build_job_request(
        "tune grpo",
        model=str(model),
        prompts=scratch / "prompts.json",
        output=scratch / "adapter.safetensors",
        reward="length",
        group=GROUP,
        iterations=1,
        beta=BETA,
        rank=RANK,
        alpha=ALPHA,
        targets=",".join(TARGETS),
        layers="all",
        learning_rate=LEARNING_RATE,
        accumulation=1,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        seed=SEED,
    )
    store = ModelStore()
    ctx = JobContext(lambda event: None, models=store)
    started = time.perf_counter()
    store.decoder(store.open(request, ctx), ctx)  # map the weights before timing, as TRL loads before train()
    load = time.perf_counter() - started

    clock, sampled = Clock(), []

    def decode_group(*args: Any, **kwargs: Any) -> Any:
        drawn = original_decode(*args, **kwargs)
        sampled.append(sum(len(g.ids) for g in drawn))
        return drawn

    def forward_part(*args: Any, **kwargs: Any) -> str:
        return "reference" if not kwargs.get("adapters", True) or not torch.is_grad_enabled() else "policy"

    original_decode = grpo.decode_group
    grpo.decode_group = clock.wrap(decode_group, "sample")
    grpo.forward_tree = clock.wrap(grpo.forward_tree, forward_part)
    grpo.tree_logprobs = clock.wrap(grpo.tree_logprobs, forward_part)
    original_backward = torch.Tensor.backward
    torch.Tensor.backward = clock.wrap(original_backward, "backward")
    try:
        started, cpu = time.perf_counter(), time.process_time()
        final = run_job("tune grpo", request, lambda event: None, models=store)
        train, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        torch.Tensor.backward = original_backward
    assert final.type == "result", final
    report = final.data["report"]
    groups = report["steps"]
    parts = {f"{part}_s": clock.seconds.get(part, 0.0) for part in PARTS}
    return {
        "side": "ster",
        "load_s": load,
        "setup_s": 0.0,
        "train_s": train,
        "train_cpu_s": cpu,
        "groups": groups,
        "per_group_s": train / groups,
        "completion_tokens": sum(sampled),
        "tokens_per_s": sum(sampled) / train,
        **parts,
        "rest_s": train - sum(parts.values()),
        "first_loss": report["first_loss"],
        "final_loss": report["final_loss"],
        "mean_kl": report["mean_kl"],
        "versions": versions,
    }


def prompts(count: int) -> list[str]:
    return json.loads(PROMPTS.read_text())["prompts"][:count]


# ---------------------------------------------------------------- TRL's worker (TRL's python)


def trl_worker(model_dir: Path, threads: int, count: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    import datasets
    import peft
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    versions = {
        name: module.__version__
        for name, module in (
            ("trl", trl),
            ("peft", peft),
            ("transformers", transformers),
            ("torch", torch),
            ("datasets", datasets),
        )
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = {tokenizer.eos_token_id}
    sampled: list[int] = []

    def length(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        """The completion's token count, its EOS not counted (Ster's ``--reward length``)."""
        counts = [len(ids) - (1 if ids and ids[-1] in eos else 0) for ids in completion_ids]
        sampled.extend(counts)
        return [float(n) for n in counts]

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    load = time.perf_counter() - started
    started = time.perf_counter()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-speed-trl-"),
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        gradient_accumulation_steps=1,
        num_iterations=1,
        num_train_epochs=1,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        beta=BETA,
        learning_rate=LEARNING_RATE,
        warmup_steps=0,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        use_vllm=False,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=SEED,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in prompts(count)]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            task_type="CAUSAL_LM", r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0, bias="none"
        ),
    )
    setup = time.perf_counter() - started
    clock = Clock()
    trainer._generate_single_turn = clock.wrap(trainer._generate_single_turn, "sample")
    started, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    train, cpu = time.perf_counter() - started, time.process_time() - cpu
    groups = trainer.state.global_step
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    sample = clock.seconds.get("sample", 0.0)
    return {
        "side": "trl",
        "load_s": load,
        "setup_s": setup,
        "train_s": train,
        "train_cpu_s": cpu,
        "groups": groups,
        "per_group_s": train / groups,
        "completion_tokens": sum(sampled),
        "tokens_per_s": sum(sampled) / train,
        "sample_s": sample,
        "rest_s": train - sample,
        "first_loss": log[0]["loss"] if log else None,
        "final_loss": log[-1]["loss"] if log else None,
        "mean_kl": log[-1].get("kl") if log else None,
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", False)),
        "dtype": str(next(trainer.model.parameters()).dtype),
        "versions": versions,
    }


WORKERS = {"ster": ster_worker, "trl": trl_worker}

if __name__ == "__main__":
    main()
