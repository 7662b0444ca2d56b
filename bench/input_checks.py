"""What the checks that run before the weights load cost: the checkpoint fingerprint, and the
context-length count of a 5 MB text.

* **fingerprint**: :func:`~ster.engine.model.fingerprint.checkpoint_fingerprint` with the
  weights file in the page cache (warm), and after asking the kernel to drop it
  (``posix_fadvise(DONTNEED)``; cold, where the file system honours it); medians of 7;
* **5 MB text**: :func:`~ster.engine.model.context.encode_within` on 280,000 repetitions of a
  short sentence, refused from the probe, against counting the whole text; medians of 3;
* **weights**: one load of the decoder (torch already imported), for scale.

    python bench/input_checks.py --model /path/to/smollm2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch  # noqa: F401  imported up front, so the weights' load below does not include it

from ster.engine.model.context import encode_within
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.loading import ModelStore
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.requests import GenerateRequest

TEXT = "the sea is calm . " * 280_000


def median_ms(action: Callable[[], object], rounds: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(rounds):
        before()
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def refused(action: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            action()
        except Refusal:
            pass

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    model = parser.parse_args().model
    from ster.engine.protocol.machine import cpu_line

    print(cpu_line(), flush=True)
    ctx = JobContext(lambda event: None)
    store = ModelStore()
    checkpoint = store.open(GenerateRequest(model=model, prompt="x"), ctx)
    weights = checkpoint.source.weights

    def evict() -> None:
        for path in weights:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    fingerprint = lambda: checkpoint_fingerprint(checkpoint.config, weights)  # noqa: E731
    print(f"fingerprint, warm: {median_ms(fingerprint, 7):.1f} ms")
    print(f"fingerprint, cold: {median_ms(fingerprint, 7, evict):.1f} ms")
    probe = refused(lambda: encode_within(checkpoint.codec, TEXT, checkpoint.context, "the text"))
    print(f"5 MB text refused against a context of {checkpoint.context}: {median_ms(probe, 3):.0f} ms")
    print(f"5 MB text counted in full: {median_ms(lambda: checkpoint.codec.encode_prompt(TEXT), 3):.0f} ms")
    started = time.perf_counter()
    store.decoder(checkpoint, ctx)
    print(f"loading the weights, once: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
