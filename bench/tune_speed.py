"""LoRA training speed and memory: ``ster tune sft | dpo | reward`` against TRL with PEFT.

Both sides train SmolLM2-135M-Instruct at f32 on the CPU with the same LoRA configuration
(rank 8, alpha 16, q_proj and v_proj on every layer, dropout 0), the same data
(bench/data/tune-sft.json: 16 short question/answer examples; bench/data/tune-pairs.json:
16 calm-chosen / alarmed-rejected pairs), a 128-token sequence limit (no sequence reaches
it), batch 1, accumulation 8 (2 optimizer steps over 16 units), learning rate 1e-4, DPO
beta 0.1, and 2 threads (``OMP_NUM_THREADS`` and ``torch.set_num_threads``). TRL runs
with gradient checkpointing off and in f32 (``bf16=False``; TRL defaults both on), its
DPO reference is the same model with the adapter disabled (TRL's default with a PEFT
config), and its reward model is ``AutoModelForSequenceClassification`` with one label
(PEFT trains the ``score`` head).

Every measurement runs in its own fresh subprocess, so its peak resident memory is its
own (``os.wait4``'s ``ru_maxrss``); sides alternate which goes first in every round, and
the table reports medians over the rounds. What is timed, per side:

* ``train s``: the training call alone, after the model is loaded. Ster: ``run_job`` of the
  tune job on a decoder already mapped (it encodes the data, draws the adapter, scores
  DPO's reference once, trains, and writes the adapter). TRL: ``trainer.train()`` on a
  trainer already built (the trainer's construction tokenizes the data and wraps the model
  in PEFT; reported apart as ``setup s``). TRL's DPO scores its reference on the fly in
  every step, inside ``train()``.
* ``load s``: reading the weights (Ster: map the checkpoint; TRL: ``from_pretrained``).
* ``process s``: the whole subprocess, interpreter start and imports included.
* ``cpu s``: user + system CPU seconds of the subprocess (less sensitive than wall time to
  other load on the machine).

Per-unit figures divide ``train s`` by the optimizer steps (SFT) or the pairs (DPO,
reward); tokens/s divides the tokens of every training sequence (each pair's two sides
together, prompt included) by ``train s``, each side counting the tokens it encoded. The
ceiling is one batched LoRA forward and backward over 8 rows of 128 tokens, every
position scored, in transformers + PEFT (and the same in Ster's decoder).

TRL is not a project dependency. Give it its own environment (the CPU build of torch is
pinned so that pip does not fetch a CUDA one):

    python3 -m venv /work/trl-venv
    /work/trl-venv/bin/pip install torch==2.13.0 transformers==5.24.0 trl==1.16.0 peft==0.21.2 \\
        datasets==5.2.0 accelerate==1.15.0

then, from the repository root, with the project's environment active:

    python bench/tune_speed.py --model /work/smol --trl-python /work/trl-venv/bin/python

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

DATA = Path(__file__).resolve().parent / "data"
SFT_DATA = DATA / "tune-sft.json"
PAIR_DATA = DATA / "tune-pairs.json"

RANK, ALPHA, TARGETS = 8, 16, ("q_proj", "v_proj")
MAX_SEQUENCE, BATCH, ACCUMULATION, LEARNING_RATE, BETA, SEED = 128, 1, 8, 1e-4, 0.1, 42
CEILING_BATCH, CEILING_LENGTH = 8, 128
OBJECTIVES = ("sft", "dpo", "reward")
UNIT = {"sft": "optimizer step", "dpo": "pair", "reward": "pair"}


# ---------------------------------------------------------------- the driver (project python)


def table(
    results: dict[tuple[str, str], list[dict[str, Any]]], ceilings: dict[str, list[dict[str, Any]]], sides: list[str]
) -> str:
    hf_ceiling = statistics.median(r["tokens_per_s"] for r in ceilings["trl"]) if ceilings.get("trl") else None
    lines = [
        (
            "| objective | side | s per unit (range) | TRL / side | train s | train cpu s | tokens | tokens/s "
            "| of ceiling | load s | process s | peak RSS MiB |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for objective in OBJECTIVES:
        runs = {side: results[(objective, side)] for side in sides if (objective, side) in results}
        if "trl" not in runs:
            continue
        trl = median(runs["trl"], "per_unit_s")
        for side, r in runs.items():
            per, speed = median(r, "per_unit_s"), median(r, "tokens_per_s")
            ratio = f"{trl / per:.2f}x" if side != "trl" else ""
            of_ceiling = f"{speed / hf_ceiling:.0%}" if hf_ceiling else "-"
            lines.append(
                f"| {objective} (per {UNIT[objective]}) | {side} | {per:.2f} ({spread(r, 'per_unit_s')}) "
                f"| {ratio} | {median(r, 'train_s'):.1f} | {median(r, 'train_cpu_s'):.1f} | {r[0]['tokens']} "
                f"| {speed:.1f} | {of_ceiling} | {median(r, 'load_s'):.1f} | {median(r, 'process_s'):.1f} "
                f"| {max(x['peak_rss_mib'] for x in r):.0f} |"
            )
    for side, name in (("trl", "transformers + PEFT"), ("ster", "Ster's decoder")):
        if ceilings.get(side):
            r = ceilings[side]
            lines.append(
                f"| ceiling: {name}, {CEILING_BATCH}x{CEILING_LENGTH} tokens forward+backward | {side} "
                f"| {median(r, 'step_s'):.2f} per batch | | | | {CEILING_BATCH * CEILING_LENGTH} "
                f"| {median(r, 'tokens_per_s'):.1f} | | | | {max(x['peak_rss_mib'] for x in r):.0f} |"
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--units", type=int, default=16, help="train on the first N examples and pairs (a smoke test)")
    parser.add_argument("--results", type=Path, help="also write every measurement here as JSON")
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        side, what = args.worker
        print(json.dumps(WORKERS[side](what, args.model.resolve(), args.threads, args.units)), flush=True)
        return
    # the parent prints the machine; a worker may run in a peer's environment, which lacks Ster
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    objectives = [o for o in args.objectives.split(",") if o]
    sides: dict[str, tuple[str, Path | None]] = {"ster": (args.python, ROOT), "trl": (args.trl_python, None)}
    if args.also_ster:
        sides[f"ster@{args.also_ster}"] = (args.python, args.also_ster.resolve())
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    ceilings: dict[str, list[dict[str, Any]]] = {}
    worker_args = ["--model", str(args.model), "--threads", str(args.threads), "--units", str(args.units)]
    load = os.getloadavg()[0]
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for objective in objectives:
            for side in order:
                python, root = sides[side]
                worker = ["--worker", "trl" if root is None else "ster", objective, *worker_args]
                result = run_worker(__file__, python, worker, environment(args.threads, root))
                results.setdefault((objective, side), []).append(result)
                print(
                    f"round {round_ + 1} {objective} {side}: {result['per_unit_s']:.2f} s per "
                    f"{UNIT[objective]}, train {result['train_s']:.1f} s, {result['tokens_per_s']:.1f} tokens/s, "
                    f"peak {result['peak_rss_mib']:.0f} MiB, load average {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        if not args.no_ceiling:
            for side in ("ster", "trl") if round_ % 2 == 0 else ("trl", "ster"):
                python, root = sides[side]
                worker = ["--worker", side, "ceiling", *worker_args]
                result = run_worker(__file__, python, worker, environment(args.threads, root))
                ceilings.setdefault(side, []).append(result)
                print(
                    f"round {round_ + 1} ceiling {side}: {result['tokens_per_s']:.1f} tokens/s",
                    file=sys.stderr,
                    flush=True,
                )
    versions = {
        side: results[next(k for k in results if k[1] == side)][0]["versions"]
        for side in sides
        if any(k[1] == side for k in results)
    }
    print(table(results, ceilings, list(sides)))
    print(
        f"\nversions: {json.dumps(versions)}; {args.rounds} rounds, {args.threads} threads; "
        f"1-minute load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    if args.results:
        args.results.write_text(
            json.dumps(
                {
                    "results": {f"{o} {s}": r for (o, s), r in results.items()},
                    "ceilings": ceilings,
                    "versions": versions,
                },
                indent=1,
            )
        )


# ---------------------------------------------------------------- Ster's worker (project python)


def ster_worker(what: str, model: Path, threads: int, count: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    import ster
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext, build_job_request, run_job

    versions = {"ster": ster.__version__, "torch": torch.__version__}
    if what == "ceiling":
        return ster_ceiling(model) | {"versions": versions}
    scratch = Path(tempfile.mkdtemp(prefix="tune-speed-"))
    (scratch / "examples.json").write_text(json.dumps({"examples": examples(count)}))
    (scratch / "pairs.json").write_text(json.dumps({"trait_name": "calm", "pairs": pairs(count)}))
    common: dict[str, Any] = {
        "model": str(model),
        "output": scratch / "adapter.safetensors",
        "rank": RANK,
        "alpha": ALPHA,
        "targets": ",".join(TARGETS),
        "layers": "all",
        "max_sequence": MAX_SEQUENCE,
        "batch_size": BATCH,
        "accumulation": ACCUMULATION,
        "learning_rate": LEARNING_RATE,
        "seed": SEED,
    }
    if what == "sft":
        request = build_job_request("tune sft", examples=scratch / "examples.json", **common)
    elif what == "dpo":
        request = build_job_request("tune dpo", pairs=scratch / "pairs.json", beta=BETA, **common)
    else:
        request = build_job_request("tune reward", pairs=scratch / "pairs.json", **common)
    store = ModelStore()
    ctx = JobContext(lambda event: None, models=store)
    started = time.perf_counter()
    store.decoder(store.open(request, ctx), ctx)  # map the weights before timing, as TRL loads before train()
    load = time.perf_counter() - started
    marks: list[tuple[float, str]] = []

    def note(event: Any) -> None:
        marks.append((time.perf_counter(), getattr(event, "stage", "") or getattr(event, "type", "")))

    started, cpu = time.perf_counter(), time.process_time()
    final = run_job(f"tune {what}", request, note, models=store)
    train, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert final.type == "result", final
    report = final.data["report"]
    units = report["examples"] if what == "sft" else report["pairs"]
    tokens = report["tokens"]
    reference = [t for t, stage in marks if stage == "reference"]
    return {
        "side": "ster",
        "objective": what,
        "load_s": load,
        "train_s": train,
        "train_cpu_s": cpu,
        "reference_s": reference[-1] - reference[0] if reference else 0.0,
        "steps": report["steps"],
        "units": units,
        "tokens": tokens,
        "per_unit_s": train / (report["steps"] if what == "sft" else units),
        "tokens_per_s": tokens / train,
        "first_loss": report["first_loss"],
        "final_loss": report["final_loss"],
        "versions": versions,
    }


def ster_ceiling(model: Path) -> dict[str, Any]:
    """One batched LoRA forward and backward through Ster's decoder, every position scored."""
    import torch
    import torch.nn.functional as F

    from ster.engine.model.adapters.lora import Adapter, attached
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext, build_job_request

    request = build_job_request(
        "tune sft", model=str(model), examples=SFT_DATA, output=Path(tempfile.mkdtemp()) / "a.safetensors"
    )
    store = ModelStore()
    ctx = JobContext(lambda event: None, models=store)
    checkpoint = store.open(request, ctx)
    decoder = store.decoder(checkpoint, ctx)
    adapter = Adapter.fresh(
        checkpoint.config,
        RANK,
        ALPHA,
        ["query", "value"],
        list(range(checkpoint.config.num_hidden_layers)),
        SEED,
        torch.device("cpu"),
    )
    adapter.trainable()
    ids = torch.randint(100, 40000, (CEILING_BATCH, CEILING_LENGTH), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        with attached(decoder, adapter):
            hidden = decoder(ids, vocab="none").hidden
            logits = decoder.project(hidden[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()

    return _ceiling_times(step)


def _ceiling_times(step: Any, rounds: int = 3) -> dict[str, Any]:
    step()  # warm up
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {"step_s": seconds, "tokens_per_s": CEILING_BATCH * CEILING_LENGTH / seconds}


# ---------------------------------------------------------------- TRL's worker (TRL's python)


def trl_worker(what: str, model_dir: Path, threads: int, count: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    import datasets
    import peft
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

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
    if what == "ceiling":
        return trl_ceiling(model_dir) | {"versions": versions}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scratch = tempfile.mkdtemp(prefix="tune-speed-trl-")
    common: dict[str, Any] = {
        "output_dir": scratch,
        "per_device_train_batch_size": BATCH,
        "gradient_accumulation_steps": ACCUMULATION,
        "num_train_epochs": 1,
        "learning_rate": LEARNING_RATE,
        "warmup_steps": 0,
        "max_length": MAX_SEQUENCE,
        "activation_checkpointing": False,
        "gradient_checkpointing": False,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "seed": SEED,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    lora: dict[str, Any] = {
        "r": RANK,
        "lora_alpha": ALPHA,
        "target_modules": list(TARGETS),
        "lora_dropout": 0.0,
        "bias": "none",
    }
    started = time.perf_counter()
    if what == "reward":
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    load = time.perf_counter() - started
    started = time.perf_counter()
    if what == "sft":
        from trl import SFTConfig, SFTTrainer

        rows = [
            {
                "prompt": [{"role": "user", "content": e["prompt"]}],
                "completion": [{"role": "assistant", "content": e["completion"]}],
            }
            for e in examples(count)
        ]
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**common, packing=False, completion_only_loss=True),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(task_type="CAUSAL_LM", **lora),
        )
        tokens = sum(len(row["input_ids"]) for row in trainer.train_dataset)
    elif what == "dpo":
        from trl import DPOConfig, DPOTrainer

        rows = [preference_row(tokenizer, pair, split_prompt=True) for pair in pairs(count)]
        trainer = DPOTrainer(
            model=model,
            args=DPOConfig(**common, beta=BETA, loss_type=["sigmoid"]),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(task_type="CAUSAL_LM", **lora),
        )
        tokens = sum(
            2 * len(row["prompt_ids"]) + len(row["chosen_ids"]) + len(row["rejected_ids"])
            for row in trainer.train_dataset
        )
    else:
        from trl import RewardConfig, RewardTrainer

        rows = [preference_row(tokenizer, pair, split_prompt=False) for pair in pairs(count)]
        trainer = RewardTrainer(
            model=model,
            args=RewardConfig(**common),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(task_type="SEQ_CLS", **lora),
        )
        tokens = sum(len(row["chosen_ids"]) + len(row["rejected_ids"]) for row in trainer.train_dataset)
    setup = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    output = trainer.train()
    train, cpu = time.perf_counter() - started, time.process_time() - cpu
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    units = len(trainer.train_dataset)
    steps = trainer.state.global_step
    return {
        "side": "trl",
        "objective": what,
        "load_s": load,
        "setup_s": setup,
        "train_s": train,
        "train_cpu_s": cpu,
        "steps": steps,
        "units": units,
        "tokens": tokens,
        "per_unit_s": train / (steps if what == "sft" else units),
        "tokens_per_s": tokens / train,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else output.training_loss,
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "checkpointing": bool(getattr(trainer.model, "is_activation_checkpointing", False)),
        "dtype": str(next(trainer.model.parameters()).dtype),
        "bf16": trainer.args.bf16,
        "versions": versions,
    }


def examples(count: int) -> list[dict[str, str]]:
    return json.loads(SFT_DATA.read_text())["examples"][:count]


def pairs(count: int) -> list[dict[str, str]]:
    return json.loads(PAIR_DATA.read_text())["pairs"][:count]


def preference_row(tokenizer: Any, pair: dict[str, str], split_prompt: bool) -> dict[str, str]:
    """A pair as TRL reads it: each side rendered exactly as Ster renders it (an assistant turn under
    the model's chat template); for DPO the text both sides share up to its last line break is the
    prompt, which TRL scores nowhere."""
    chosen, rejected = (
        tokenizer.apply_chat_template([{"role": "assistant", "content": pair[side]}], tokenize=False)
        for side in ("positive", "negative")
    )
    if not split_prompt:
        return {"chosen": chosen, "rejected": rejected}
    shared = os.path.commonprefix([chosen, rejected])  # noqa: RUF071 - by character, then cut at a line
    cut = shared.rfind("\n") + 1
    return {"prompt": chosen[:cut], "chosen": chosen[cut:], "rejected": rejected[cut:]}


def trl_ceiling(model_dir: Path) -> dict[str, Any]:
    """One batched LoRA forward and backward in transformers + PEFT, every position scored."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0, task_type="CAUSAL_LM"),
    )
    model.train()
    ids = torch.randint(100, 40000, (CEILING_BATCH, CEILING_LENGTH), generator=torch.Generator().manual_seed(0))
    return _ceiling_times(lambda: model(input_ids=ids, labels=ids).loss.backward())


WORKERS = {"ster": ster_worker, "trl": trl_worker}

if __name__ == "__main__":
    main()
