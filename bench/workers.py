"""What the training benchmarks share: a measurement in a fresh subprocess, its environment, medians.

``tune_speed.py`` and ``grpo_speed.py`` run every measurement as ``python SCRIPT --worker ...`` in
its own process, so its peak resident memory (``os.wait4``'s ``ru_maxrss``) and CPU time are its
own; the worker prints its result as the last JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_worker(script: str, python: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one measurement of ``script`` in a fresh process; its result, with its wall time, CPU time and peak RSS."""
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        started = time.perf_counter()
        process = subprocess.Popen(
            [python, str(Path(script).resolve()), *args], stdout=out_file, stderr=err_file, env=env, cwd=ROOT, text=True
        )
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS and CPU time
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out_file.seek(0), err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"worker {' '.join(args)} failed ({process.returncode}):\n{err[-4000:]}")
    result = json.loads(lines[-1])
    result.update(process_s=wall, cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_mib=usage.ru_maxrss / 1024)
    return result


def environment(threads: int, ster_root: Path | None) -> dict[str, str]:
    """The workers' environment: ``threads`` threads, offline, quiet; ``ster_root``'s ster when given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TQDM_DISABLE="1",
        PYTHONUNBUFFERED="1",
    )
    if ster_root is not None:
        env["PYTHONPATH"] = str(ster_root)  # that checkout's ster, whatever is installed
    return env


def median(results: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in results)


def spread(results: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in results]
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"
