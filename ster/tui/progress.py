"""How far a job has come, read from its events: a stage, its sentence, and a fraction that only grows.

A job's progress events count within their own stage (``optimize`` reads pair 1..12,
then fits layer 1..3, then refits once without a count), so the count of one event
is not the job's. Each job has a plan: the stages it passes through, in order, and the
share of the bar each one takes. An event's fraction is its stage's start plus the
stage's share times ``current / total``; an event of a stage outside the plan, or
without a count, leaves the bar where it is. The bar never moves back, so a stage that
counts again from 1 reads as what it is: more work on the way to the end.

A :class:`Track` belongs to the worker thread of its job, which attaches each
:class:`Step` to the message it posts; the UI only reads the steps. Nothing here
imports textual or torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

LOADING = (("resolve", 2), ("load", 10))
"""Every job that maps a checkpoint resolves it, then loads its weights (skipped when the app holds them)."""
PLANS: dict[str, tuple[tuple[str, float], ...]] = {
    "train": (*LOADING, ("read", 78), ("fit", 10)),
    "optimize": (*LOADING, ("read", 70), ("fit", 18)),
    "evaluate": (*LOADING, ("read", 88)),
    "calibrate": (*LOADING, ("read", 8), ("calibrate", 72), ("judge", 8)),
    "generate": (*LOADING, ("generate", 88)),
    "sweep": (*LOADING, ("sweep", 88)),
    "extract": (*LOADING, ("read", 88)),
    "pairs inspect": (("inspect", 100),),
    "pairs synthesize": (*LOADING, ("synthesize|kept", 88)),
    "tune sft": (*LOADING, ("train", 88)),
    "tune dpo": (*LOADING, ("reference", 8), ("train", 80)),
    "tune reward": (*LOADING, ("train", 88)),
    "tune grpo": (*LOADING, ("train", 88)),
}
"""Job name → (stage, share of the bar) in the order the job emits them; ``a|b`` names one segment two
stages share (synthesis counts kept pairs in both)."""
RUNNING_AT_MOST = 0.99
"""A running job shows at most 99%: its last counted step is followed by work no event counts (a refit,
the atomic write); 100% means the job has ended with its result."""
STAGE_WORDS = {
    "resolve": "resolving",
    "load": "loading",
    "read": "reading",
    "fit": "fitting",
    "generate": "generating",
    "sweep": "sweeping",
    "inspect": "inspecting",
    "synthesize": "synthesizing",
    "kept": "synthesizing",
    "train": "training",
    "reference": "scoring the reference",
    "sample": "sampling",
    "skip": "skipping",
    "calibrate": "calibrating",
    "judge": "judging",
}
"""How the progress line names a stage; a stage not listed shows under its own name."""


@dataclass(frozen=True)
class Step:
    """What a progress line shows for one moment of a job."""

    stage: str
    """The stage in words ("loading"); empty before the job's first event."""
    message: str
    """The engine's sentence for the step."""
    fraction: float
    """0..1 of the whole job, never less than the step before."""


class Track:
    """Turns one job's events into steps; used by that job's worker thread only."""

    def __init__(self, job: str, max_tokens: int | None = None) -> None:
        segments, start = {}, 0.0
        plan = PLANS.get(job, ())
        total = sum(share for _, share in plan) or 1.0
        for names, share in plan:
            for name in names.split("|"):
                segments[name] = (start / total, share / total)
            start += share
        self._segments: dict[str, tuple[float, float]] = segments
        self._max_tokens = max_tokens
        self.step = Step("", "", 0.0)

    def advance(self, event: Any) -> Step | None:
        """The step after a progress or token event; None when the event does not change what is shown."""
        if event.type == "progress":
            moved = self._at(event.stage, event.current, event.total)
            return self._take(Step(STAGE_WORDS.get(event.stage, event.stage), event.message, moved))
        if event.type == "token" and self._max_tokens and event.stream == "text":
            return self._take(
                Step(self.step.stage, self.step.message, self._at("generate", event.index + 1, self._max_tokens))
            )
        return None

    def _at(self, stage: str, current: int | None, total: int | None) -> float:
        start, share = self._segments.get(stage, (self.step.fraction, 0.0))
        done = min(current / total, 1.0) if current is not None and total else 0.0
        return max(self.step.fraction, min(start + share * done, RUNNING_AT_MOST))

    def _take(self, step: Step) -> Step | None:
        if step == self.step:
            return None
        self.step = step
        return step


def first_step(job: str) -> Step:
    """What a job does before its first event: a job that maps a checkpoint imports torch first, which takes
    seconds the first time in a session. Read on the worker thread just before the job runs, where it is
    still true (once the job runs, torch is in ``sys.modules`` while it is being imported)."""
    if PLANS.get(job, (("",),))[0][0] == "resolve" and "torch" not in sys.modules:
        return Step("", "starting the engine (importing torch, a few seconds the first time)", 0.0)
    return Step("", "starting", 0.0)
