"""A full default calibration, timed: ``ster calibrate`` on SmolLM2-135M-Instruct (or Gemma 3 270M with
``--gemma``, or any checkpoint with ``--model``) with every default — all layers, caa/pca/logistic, both
signs, the calm pairs (tests/data/calm-fit.json, held out: calm-holdout.json), the 72 bundled neutral
prompts — in a subprocess, as a user runs it.

It prints the CPU and its instruction sets, the wall time of the whole run (interpreter start and model
load included), the time from the first trial to the last, and the seconds per evaluated configuration (a
candidate's ladder of six strengths and strength 0; the ladder's strengths count as configurations too, the
way a sampler that tries one strength a trial would count them).

    python bench/calibrate_speed.py [--gemma | --model DIR] [--threads N]

Not done yet: heretic-llm's own trial on the same model, side by side (the issue's comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decode_speed import bench_model, model_arguments

from ster.engine.protocol.machine import cpu_line

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = bench_model(args)
    print(cpu_line())
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "calm.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        command = [sys.executable, "-m", "ster", "--json", "calibrate", "--model", str(model), "--pairs",
                   str(DATA / "calm-fit.json"), "--holdout", str(DATA / "calm-holdout.json"), "--output", str(out)]
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
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
    print(f"whole run: {wall:.1f} s; search: {search:.1f} s, {search / trials:.2f} s per candidate, "
          f"{search / rungs:.2f} s per configuration")
    chosen = record["positive"], record["negative"]
    print("chosen: " + "; ".join(f"{s['strength']:+.3g}x at KL {s['kl']:.3f}" for s in chosen if s))


if __name__ == "__main__":
    main()
