"""The adapters and checkpoints of this app session: what the Adapters tab lists.

The app fills the book from every tune run's end (:meth:`SterApp.on_job_finished`), so it is
right whether or not the Adapters tab was ever shown: a finished run's adapter, and a cancelled
run's kept checkpoint (``<output>.checkpoint``). The Adapters tab adds what it loads (the
``tune inspect`` document) and what it measures (two ``tune evaluate`` results, base and
adapter). Nothing here computes a number: the summaries quote the engine's reports. Nothing
here imports textual or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TUNE_RUNS = {"tune sft": "sft", "tune dpo": "dpo", "tune reward": "reward", "tune grpo": "grpo"}
"""The jobs that train an adapter, and the objective each names (dpo's report says dpo or ipo)."""


@dataclass
class AdapterEntry:
    """One adapter, PEFT directory or checkpoint the session made or loaded."""

    path: Path
    kind: str
    """``adapter``, ``reward`` (a reward model), ``peft`` (a PEFT directory) or ``checkpoint``."""
    objective: str
    """sft, dpo, ipo, reward, grpo; ``?`` when a loaded adapter's report does not say."""
    model: str
    """The model it was trained for, as its sidecar names it (empty when unknown)."""
    summary: str
    """The report in a few words: final loss, accuracy, the step a checkpoint stopped at."""
    origin: str = "trained"
    """``trained`` in this session, ``cancelled`` (a checkpoint), or ``loaded`` from a path."""
    report: dict[str, Any] | None = None
    """The run's report (the sidecar's ``train``), when known."""
    document: dict[str, Any] | None = None
    """The ``tune inspect`` document (``adapter``: the sidecar, its tensors), once read."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """``tune evaluate`` results by role, ``base`` and ``adapter``, with the example set under ``examples``."""

    @property
    def usable(self) -> bool:
        """A generation adapter: what Generate can apply, evaluate can score and merge can fold in."""
        return self.kind in ("adapter", "peft")

    def info(self) -> dict[str, Any]:
        """What the app's settings keep about the current adapter."""
        return {"objective": self.objective, "model": self.model, "summary": self.summary, "kind": self.kind}


class AdapterBook:
    """Every entry once, by path, oldest first; the newest entry of a path replaces the older one."""

    def __init__(self) -> None:
        self.entries: list[AdapterEntry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, path: Path | str) -> AdapterEntry | None:
        return next((entry for entry in self.entries if entry.path == Path(path)), None)

    def add(self, entry: AdapterEntry) -> AdapterEntry:
        """Add ``entry``, or replace the one at its path (keeping what was measured of a file that did not change)."""
        old = self.get(entry.path)
        if old is not None:
            self.entries.remove(old)
            if entry.document is None and entry.origin == old.origin:
                entry.document = old.document
        self.entries.append(entry)
        return entry

    def from_tune_run(self, job: str, fields: dict[str, Any], final: Any) -> AdapterEntry | None:
        """The entry a tune run's final event makes: its adapter when it finished, its checkpoint when it was
        cancelled after keeping one; None otherwise (refused, failed, cancelled before a step)."""
        objective = TUNE_RUNS.get(job)
        if objective is None:
            return None
        model = str(fields.get("model", ""))
        if final.type == "result":
            report = final.data["report"]
            objective = report.get("loss", objective) if objective == "dpo" else objective
            kind = "reward" if objective == "reward" else "adapter"
            self.finished(Path(final.data["path"]))
            return self.add(
                AdapterEntry(
                    Path(final.data["path"]), kind, objective, model, summary(objective, report), "trained", report
                )
            )
        stopped = final.details if final.kind == "cancelled" else None  # where a cancelled run stopped
        if not stopped or "checkpoint" not in stopped:
            return None
        done, total, where = stopped["step"], stopped["total"], stopped["checkpoint"]
        objective = fields.get("loss", objective) if objective == "dpo" else objective
        return self.add(
            AdapterEntry(Path(where), "checkpoint", objective, model, f"checkpoint, step {done}/{total}", "cancelled")
        )

    def from_inspection(self, path: Path, document: dict[str, Any]) -> AdapterEntry:
        """A loaded adapter: the ``tune inspect`` document says what it is."""
        adapter = document["adapter"]
        report = adapter.get("train")
        kind = "peft" if adapter.get("product") == "peft" else adapter.get("kind", "adapter")
        objective = objective_of(kind, report)
        words = summary(objective, report) if report else f"rank {adapter['rank']}, no report"
        entry = AdapterEntry(path, kind, objective, str(adapter.get("model") or ""), words, "loaded", report, document)
        old = self.get(path)
        if old is not None:
            entry.evaluation = old.evaluation
        return self.add(entry)

    def finished(self, path: Path) -> None:
        """A run wrote ``path``: the engine removed its checkpoint, so the list drops the checkpoint's row."""
        for entry in [e for e in self.entries if e.kind == "checkpoint" and e.path == checkpoint_of(path)]:
            self.entries.remove(entry)


def checkpoint_of(output: Path) -> Path:
    """Where a cancelled run of ``output`` keeps its checkpoint: the engine's rule, read from the engine."""
    from ster.engine.tune.checkpoint import checkpoint_path  # (no torch; kept out of the first paint)

    return checkpoint_path(output)


def objective_of(kind: str, report: dict[str, Any] | None) -> str:
    """The objective a loaded adapter was trained with, from its report's own fields."""
    if kind == "reward":
        return "reward"
    if not report:
        return "peft" if kind == "peft" else "?"
    if report.get("loss") in ("dpo", "ipo"):
        return str(report["loss"])
    if "mean_reward" in report:
        return "grpo"
    return "sft" if "examples" in report else "?"


def summary(objective: str, report: dict[str, Any] | None) -> str:
    """A report in a few words, as the list shows it: the final loss and what the objective adds."""
    if not report:
        return ""
    parts = []
    if isinstance(report.get("final_loss"), int | float):
        parts.append(f"loss {report['final_loss']:.4f}")
    if objective in ("dpo", "ipo", "reward") and isinstance(report.get("accuracy"), int | float):
        parts.append(f"acc {report['accuracy']:.3f}")
    elif objective == "grpo" and isinstance(report.get("mean_reward"), int | float):
        parts.append(f"reward {report['mean_reward']:.2f}")
    return ", ".join(parts)
