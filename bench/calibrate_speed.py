"""A full default calibration, timed: ``ster calibrate`` on SmolLM2-135M-Instruct (or Gemma 3 270M with
``--gemma``, or any checkpoint with ``--model``) with every default — all layers, caa/pca/logistic, both
signs, the calm pairs (tests/data/calm-fit.json, held out: calm-holdout.json), the 72 bundled neutral
prompts — in a subprocess, as a user runs it.

It prints the CPU and its instruction sets, the wall time of the whole run (interpreter start and model
load included), the time from the first trial to the last, and the seconds per evaluated configuration (a
candidate's ladder of six strengths and strength 0; the ladder's strengths count as configurations too, the
way a sampler that tries one strength a trial would count them).

    python bench/calibrate_speed.py [--gemma | --model DIR] [--threads N] [--heretic-python PY]

With ``--heretic-python`` (the interpreter of a venv holding heretic-llm, never Ster's own), the same run then
times heretic-llm's own trial on the same checkpoint at the same thread count (bench/heretic_trial.py, in a
subprocess of that venv), on as many prompts as Ster screens a candidate on, and prints the ratio of the two
sides' seconds per configuration. What each side does per configuration:

- Ster, per candidate (one trial of the search): one batched measurement of ``LADDER``'s six strengths and
  strength 0, every strength one row of the same forwards, over ``SCREEN_PROMPTS`` neutral prompts (the mean KL
  over a 16-token greedy continuation and the first-token KL) and ``SCREEN_PAIRS`` held-out pairs (both answers'
  first 16 tokens scored); a configuration is one (candidate, steered strength): six a candidate.
- heretic, per trial (one configuration): ``reset_model`` and ``abliterate`` (rank-1 LoRA on every o_proj and
  down_proj) with the trial's parameters, then ``Evaluator.get_score``: first-token KL over the same
  ``SCREEN_PROMPTS`` neutral prompts (those Ster's seed screens on) as its harmless evaluation prompts, and a greedy
  response of up to heretic's ``max_response_length`` (100) tokens to ``SCREEN_PAIRS`` harmful prompts
  (bench/data/heretic-harmful.txt), counted as refusals. Its refusal directions come from the other 64 neutral
  prompts and the other 24 harmful prompts (heretic downloads its datasets from the Hugging Face hub; these are
  local stand-ins). The median of ``--heretic-trials`` trials after one warm-up trial.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decode_speed import bench_model, model_arguments

from ster.engine.protocol.machine import cpu_line
from ster.engine.steering.calibrate import LADDER, SCREEN_PAIRS, SCREEN_PROMPTS
from ster.engine.steering.requests import CalibrateRequest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
NEUTRAL = REPO / "ster" / "data" / "examples" / "neutral.json"
HARMFUL = REPO / "bench" / "data" / "heretic-harmful.txt"


def heretic_trial(
    python: Path, model: Path, threads: int, trials: int, scratch: Path, max_response_length: int | None
) -> dict:
    """heretic-llm's trial timed by bench/heretic_trial.py in its own venv: its harmless evaluation prompts are the
    neutral prompts Ster's default seed screens on (the rest compute its refusal directions)."""
    prompts = json.loads(NEUTRAL.read_text())["prompts"]
    seed = CalibrateRequest.model_fields["seed"].default
    screened = sorted(random.Random(seed).sample(range(len(prompts)), min(SCREEN_PROMPTS, len(prompts))))
    good = scratch / "harmless.txt"
    good.write_text(
        "\n".join([prompts[i] for i in screened] + [p for i, p in enumerate(prompts) if i not in screened]) + "\n"
    )
    out = scratch / "heretic.json"
    command = [
        str(python),
        str(REPO / "bench" / "heretic_trial.py"),
        "--model",
        str(model.resolve()),
        "--good",
        str(good),
        "--bad",
        str(HARMFUL),
        "--good-eval",
        str(len(screened)),
        "--bad-eval",
        str(SCREEN_PAIRS),
        "--trials",
        str(trials),
        "--threads",
        str(threads),
        "--response-prefix",
        "",
        "--output",
        str(out),
    ]
    if max_response_length is not None:
        command += ["--max-response-length", str(max_response_length)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(threads), TMPDIR=str(scratch), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    started = time.perf_counter()
    proc = subprocess.run(
        command, check=False, cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.returncode == 0, f"heretic trial failed:\n{proc.stderr[-3000:]}"
    record = json.loads(out.read_text())
    record["wall_seconds"] = time.perf_counter() - started
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--heretic-python",
        type=Path,
        default=None,
        help="the python of a venv with heretic-llm: time its trial in the same run, side by side",
    )
    parser.add_argument("--heretic-trials", type=int, default=2, help="heretic trials timed, after one warm-up")
    parser.add_argument(
        "--heretic-max-response-length",
        type=int,
        default=None,
        help="heretic's max_response_length (default: heretic's own, 100)",
    )
    args = parser.parse_args()
    model = bench_model(args)
    print(cpu_line())
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "calm.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        command = [
            sys.executable,
            "-m",
            "ster",
            "--json",
            "calibrate",
            "--model",
            str(model),
            "--pairs",
            str(DATA / "calm-fit.json"),
            "--holdout",
            str(DATA / "calm-holdout.json"),
            "--output",
            str(out),
        ]
        started = time.perf_counter()
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert proc.stdout is not None
        first = last = None
        for line in proc.stdout:
            event = json.loads(line)
            if event["type"] == "progress" and event["message"].startswith("trial "):
                first = first or time.perf_counter()
            if event["type"] == "log" and event["message"].startswith("trial ") and " score " in event["message"]:
                last = time.perf_counter()
        wall = time.perf_counter() - started
        assert proc.wait() == 0, "calibrate failed"
        record = json.loads(out.read_text())["calibration"]
    trials = len(record["trials"])
    rungs = sum(len(t["points"]) - 1 for t in record["trials"])
    search = (last or wall) - (first or 0.0)
    print(f"model: {model}; {args.threads} threads; {trials} candidates, {rungs} steered configurations")
    print(
        f"whole run: {wall:.1f} s; search: {search:.1f} s, {search / trials:.2f} s per candidate, "
        f"{search / rungs:.2f} s per configuration"
    )
    chosen = record["positive"], record["negative"]
    print("chosen: " + "; ".join(f"{s['strength']:+.3g}x at KL {s['kl']:.3f}" for s in chosen if s))
    print(
        f"ster, per candidate: one batched measurement of {len(LADDER) * 2} strengths and 0 over "
        f"{SCREEN_PROMPTS} neutral prompts (16-token continuation KL) and {SCREEN_PAIRS} held-out pairs"
    )
    if args.heretic_python is None:
        return
    with tempfile.TemporaryDirectory() as scratch:
        heretic = heretic_trial(
            args.heretic_python,
            model,
            args.threads,
            args.heretic_trials,
            Path(scratch),
            args.heretic_max_response_length,
        )
    per_trial = heretic["median_seconds"]
    print(
        f"heretic-llm {heretic['heretic']} (torch {heretic['torch']}, transformers {heretic['transformers']}, "
        f"{heretic['dtype']}, {heretic['threads']} threads, batch {heretic['batch_size']}), per trial: abliterate, "
        f"first-token KL on {heretic['good_eval']} harmless prompts, up to {heretic['max_response_length']} "
        f"tokens for each of {heretic['bad_eval']} harmful prompts (refusals); directions from "
        f"{heretic['good_direction']} + {heretic['bad_direction']} prompts"
    )
    print(
        "heretic trials: "
        + ", ".join(
            f"{t['seconds']:.1f} s (abliterate {t['abliterate']:.1f}, KL "
            f"{t['kl_seconds']:.1f}, refusals {t['refusal_seconds']:.1f}; "
            f"KL {t['kl']:.3f}, {t['refusals']}/{heretic['bad_eval']} refused)"
            for t in heretic["trials"]
        )
        + f"; warm-up {heretic['warmup_seconds']:.1f} s; setup {heretic['setup_seconds']:.0f} s; "
        f"whole: {heretic['wall_seconds']:.0f} s"
    )
    ster_config, ster_candidate = search / rungs, search / trials
    print(
        f"heretic: {per_trial:.2f} s per configuration (median trial); ster: {ster_config:.2f} s per "
        f"configuration, {ster_candidate:.2f} s per candidate"
    )
    print(
        f"ratio, heretic / ster seconds per configuration: {per_trial / ster_config:.1f}x "
        f"(per ster candidate: {per_trial / ster_candidate:.1f}x); goal 3x: "
        f"{'met' if per_trial / ster_config >= 3 else 'not met'}"
    )


if __name__ == "__main__":
    main()
