"""Abliteration end to end on a real refusal, and heretic-llm's search side by side on the same model.

The model is SmolLM2-135M-Instruct taught to refuse every cooking question (bench/refusing_model.py builds it
into ``.bench/smollm2-refusing`` with ``ster tune sft`` and ``ster tune merge``). Then, as a user runs it:

1. ``ster calibrate --mode ablate`` on ``tests/data/refusal/pairs.json`` (cooking questions against other
   questions, the train splits), its held-out pairs the held-out cooking and other questions, its KL measured
   on the held-out other questions, ``--kl-budget 0.1``, ``--trials N``;
2. the chosen ablation, live in Ster: the share of held-out cooking questions still refused (greedy, 24 tokens,
   the marker judge) and the first-token KL on the held-out other questions, from the calibrated artifact's
   record;
3. ``ster bake`` of it into a checkpoint, loaded by transformers' own ``AutoModelForCausalLM``: the same two
   numbers measured there, with transformers' ``generate`` and its logits;
4. with ``--heretic-python`` (a venv holding heretic-llm, never Ster's own): heretic's own trial
   (bench/heretic_trial.py) for the same number of trials on the same model, its refusal directions from the
   same train questions, its harmless evaluation prompts the held-out other questions and its harmful ones the
   held-out cooking questions, responses of 24 tokens; its best trial within the budget.

It prints the CPU, each side's best refusals and KL, and each side's seconds per trial (Ster: the search's time
over its trials; heretic: the median of its timed trials after a warm-up).

    python bench/abliteration.py [--trials 32] [--threads 2] [--screen 40] [--heretic-python /work/heretic-venv/bin/python]

Ster's trial screens 16 trait prompts and every neutral prompt up to 40 (the search's own sizes) where
heretic's trial measures every evaluation prompt (40 and 40 here); ``--screen 40`` makes Ster's trials measure
as many.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "refusal"
BUDGET = 0.1
ANSWER_TOKENS = 24


def questions(name: str) -> list[str]:
    raw = json.loads((DATA / name).read_text())
    return raw["prompts"] if isinstance(raw, dict) else raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / ".bench" / "smollm2-refusing")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heretic-python", type=Path, default=None)
    parser.add_argument("--heretic-trials", type=int, default=None, help="heretic's trials (default: --trials)")
    parser.add_argument(
        "--screen",
        type=int,
        default=None,
        help="Ster's screening prompts of each kind (default: the search's own, 16 trait and up to 40 neutral); 40 "
        "screens every held-out prompt, as each of heretic's trials measures them all",
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from ster.engine.protocol.jobs import build_job_request, run_job
    from ster.engine.protocol.machine import cpu_line
    from ster.engine.steering.refusal_judge import MARKERS, refuses

    print(cpu_line(), flush=True)
    if args.screen is not None:
        from ster.engine.steering import ablation_search

        ablation_search.SCREEN_PROMPTS = ablation_search.SCREEN_NEUTRAL = args.screen
        print(f"screening on {args.screen} trait and {args.screen} neutral prompts", flush=True)
    if not args.model.is_dir():
        sys.exit(f"no refusing model at {args.model}: build it with python bench/refusing_model.py")
    scratch = Path(tempfile.mkdtemp(prefix="ster-abliteration-"))
    cooking, other = questions("cooking-heldout.json"), questions("other-heldout.json")
    held = {"trait_name": "refusal", "pairs": [{"positive": c, "negative": o} for c, o in zip(cooking, other)]}
    (scratch / "held.json").write_text(json.dumps(held))
    (scratch / "neutral.json").write_text(json.dumps({"prompts": other}))

    stamps: dict[str, float] = {}

    def seen(event) -> None:
        message = getattr(event, "message", "")
        if message.startswith("trials 1-") and "first" not in stamps:
            stamps["first"] = time.perf_counter()
        if message.startswith("measuring the chosen ablation"):
            stamps["last"] = time.perf_counter()

    started = time.perf_counter()
    request = build_job_request(
        "calibrate",
        model=str(args.model),
        pairs=DATA / "pairs.json",
        holdout=scratch / "held.json",
        neutral=scratch / "neutral.json",
        mode="ablate",
        kl_budget=str(BUDGET),
        trials=str(args.trials),
        seed=str(args.seed),
        judge="none",
        output=scratch / "ablated.json",
    )
    final = run_job("calibrate", request, seen, threading.Event())
    if final.type != "result":
        sys.exit(f"calibrate: {final.message}")
    whole = time.perf_counter() - started
    record = final.data["calibration"]["ablation"]
    ster_per_trial = (stamps["last"] - stamps["first"]) / args.trials
    print(
        f"ster calibrate --mode ablate, {args.trials} trials: {whole:.0f} s in all, {ster_per_trial:.2f} s a trial; "
        f"held-out cooking refused {record['trait_rate_before']:.0%} -> {record['trait_rate']:.0%}, other "
        f"questions refused {record['answered_rate_before']:.0%} -> {record['answered_rate']:.0%}, first-token KL "
        f"{record['kl_first']:.4f} on the held-out other questions",
        flush=True,
    )

    baked = run_job(
        "bake",
        build_job_request("bake", model=str(args.model), vector=scratch / "ablated.json", output=scratch / "baked"),
        lambda event: None,
        threading.Event(),
    )
    if baked.type != "result":
        sys.exit(f"bake: {baked.message}")
    rate, kl = transformers_measures(args.model, scratch / "baked", cooking, other, MARKERS, refuses)
    print(
        f"baked checkpoint in transformers: held-out cooking refused {rate:.0%}, first-token KL {kl:.4f} on the "
        "held-out other questions",
        flush=True,
    )
    results = {
        "ster": {
            **{k: record[k] for k in ("trait_rate_before", "trait_rate", "answered_rate", "kl_first")},
            "seconds_per_trial": ster_per_trial,
            "baked_refused": rate,
            "baked_kl_first": kl,
        },
    }
    if args.heretic_python is not None:
        heretic = heretic_run(args, cooking, other, scratch)
        best = min(
            heretic["trials"],
            key=lambda t: (t["kl"] > BUDGET, t["refusals"], t["kl"]),
        )
        total = heretic["bad_eval"]
        print(
            f"heretic-llm {heretic['heretic']}, {len(heretic['trials'])} timed trials: median "
            f"{heretic['median_seconds']:.2f} s a trial; best within KL {BUDGET}: {best['refusals']}/{total} "
            f"held-out cooking refused ({best['refusals'] / total:.0%}, from {heretic['base_refusals']}/{total}) "
            f"at first-token KL {best['kl']:.4f}",
            flush=True,
        )
        print(f"heretic's seconds a trial over Ster's: {heretic['median_seconds'] / ster_per_trial:.1f}x", flush=True)
        results["heretic"] = {
            "best": best,
            "median_seconds": heretic["median_seconds"],
            "base_refusals": heretic["base_refusals"],
        }
    print(json.dumps(results))


def transformers_measures(base: Path, baked: Path, cooking, other, markers, refuses) -> tuple[float, float]:
    """The baked checkpoint in transformers: the share of cooking questions its greedy answers refuse, and the
    mean first-token KL from the unbaked model on the other questions (both through the chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    edited = AutoModelForCausalLM.from_pretrained(baked, dtype=torch.float32).eval()
    original = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()

    def ids(question: str) -> torch.Tensor:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids

    refused = 0
    with torch.no_grad():
        for question in cooking:
            prompt = ids(question)
            out = edited.generate(prompt, max_new_tokens=ANSWER_TOKENS, do_sample=False)
            refused += refuses(tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True), markers)
        kls = []
        for question in other:
            prompt = ids(question)
            p = torch.log_softmax(original(prompt).logits[0, -1].double(), -1)
            q = torch.log_softmax(edited(prompt).logits[0, -1].double(), -1)
            kls.append(float((p.exp() * (p - q)).sum()))
    return refused / len(cooking), sum(kls) / len(kls)


def heretic_run(args: argparse.Namespace, cooking: list[str], other: list[str], scratch: Path) -> dict:
    """bench/heretic_trial.py in heretic's venv: the held-out questions are its evaluation prompts (the first lines
    of each file), the train questions compute its refusal directions."""
    good = scratch / "good.txt"
    bad = scratch / "bad.txt"
    good.write_text("\n".join(other + questions("other-train.json")) + "\n")
    bad.write_text("\n".join(cooking + questions("cooking-train.json")) + "\n")
    out = scratch / "heretic.json"
    command = [
        str(args.heretic_python),
        str(REPO / "bench" / "heretic_trial.py"),
        "--model",
        str(args.model),
        "--good",
        str(good),
        "--bad",
        str(bad),
        "--good-eval",
        str(len(other)),
        "--bad-eval",
        str(len(cooking)),
        "--trials",
        str(args.heretic_trials or args.trials),
        "--threads",
        str(args.threads),
        "--max-response-length",
        str(ANSWER_TOKENS),
        "--seed",
        str(args.seed),
        "--output",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


if __name__ == "__main__":
    main()
