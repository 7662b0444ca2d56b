"""The training objectives: what one forward's units cost, and what a run reports about them.

Each objective turns a list of units (examples, or pairs of a chosen and a rejected
side) into one f32 loss per unit and a few plain numbers per unit; the loop
(:mod:`ster.engine.tune.loop`) owns batching, accumulation, the schedule and the
optimizer, so a new objective (GRPO) adds a class here rather than a loop.

* sft: mean cross-entropy over the completion tokens; the prompt is never a target;
* dpo: ``softplus(-β·margin)``, margin = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r)),
  sequence log-probabilities summed over every token after the first; ipo: ``(margin −
  1/(2β))²`` over log-ratios divided by their token counts. The reference is the same
  decoder with adapters off, scored once before the first step (each rank its share);
* reward: Bradley–Terry ``-log σ(r_c − r_r)``, a zero-initialised ``[1, hidden]`` head
  without bias on the final-normed state at each side's last token; no vocabulary projection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.protocol.errors import Cancelled
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.parallel import Parallel
from ster.engine.tune.rows import forward_tree, tree_last_states, tree_logprobs


@dataclass(frozen=True)
class Unit:
    """One trainable unit: an example (one row) or a pair (chosen row, rejected row)."""

    index: int
    """Its position in the data, 0-based."""
    rows: tuple[list[int], ...]
    starts: tuple[int, ...]
    """Per row, the first scored token: the completion's first (sft), 1 for a whole side (dpo)."""

    @property
    def length(self) -> int:
        return max(len(row) for row in self.rows)

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.rows)

    @property
    def pair(self) -> bool:
        return len(self.rows) == 2


Stats = dict[str, float]
ONE_PROCESS = Parallel()


@dataclass(frozen=True)
class Report:
    """What an objective's per-unit numbers come to, over a step or an epoch."""

    shown: dict[str, float] = field(default_factory=dict)
    """On a step's line and in its progress data (dpo: accuracy)."""
    data: dict[str, float] = field(default_factory=dict)
    """In a step's progress data only (dpo: the reward margin)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """The objective's own fields of the run's report, from its final epoch."""
    epoch: dict[str, Any] = field(default_factory=dict)
    """An epoch's history entry, besides its number."""
    tail: str = ""
    """What an epoch's log line says after its mean loss."""


@dataclass(frozen=True)
class Place:
    """Where a step stands in the run, 1-based, for its progress line."""

    epoch: int
    epochs: int
    within: int
    """The step's number within its epoch."""
    steps: int
    """Steps per epoch."""
    step: int
    total: int
    done: int
    """Units done in this epoch, of ``units``."""
    units: int


def rows_of(units: list[Unit]) -> list[list[int]]:
    """Every row of ``units``, in order."""
    return [row for unit in units for row in unit.rows]


def _scored(decoder: Decoder, units: list[Unit], adapters: bool = True) -> list[Tensor]:
    """Token log-probabilities of every row of ``units`` in order, from one forward of the rows packed
    along their shared prefixes (a pair's prompt, the system turn before every example) so that each
    shared token is computed once; equal to scoring every row alone (tested to 1e-5)."""
    rows, starts = rows_of(units), [start for unit in units for start in unit.starts]
    hidden, tree = forward_tree(decoder, rows, adapters)
    return tree_logprobs(decoder, hidden, tree, rows, starts)


class Objective:
    """The interface every objective implements."""

    name: str = ""
    unit: str = "example"
    fusable: bool = True
    """Whether a step's consecutive forwards may run as one (GRPO's prompts each run alone)."""

    def begin(self, epoch: int) -> None:
        """Called before each step's forwards with the epoch (GRPO's iteration) it belongs to."""

    def step_tokens(self, units: list[Unit], stats: list[Stats]) -> int:
        """Tokens a step processed, for its tokens/s: every row's, by default."""
        return sum(unit.tokens for unit in units)

    step_line = "epoch {epoch}/{epochs} step {step}/{total} {unit} {done}/{units} loss {loss:.4f}{shown}"
    """A step's progress line: the contract's words, filled from :class:`Place` and the report's ``shown``."""
    epoch_line = "epoch {epoch}/{epochs} mean loss {mean_loss:.4f}{tail}"
    """An epoch's log line, filled from its history entry and the report's ``tail``."""
    period = "epoch"
    """What a history entry is numbered by (GRPO: the iteration)."""

    def report(self, stats: list[Stats]) -> Report:
        """The one reporting hook: what a step's or an epoch's per-unit numbers come to. The default reports
        the mean loss alone."""
        return Report(epoch={"mean_loss": mean(s["loss"] for s in stats)})

    def step_message(self, place: Place, loss: float, report: Report) -> str:
        """The progress line of a step, from its place in the run and its report."""
        shown = "".join(f" {name} {value:.3f}" for name, value in report.shown.items())
        return self.step_line.format(**vars(place), unit=self.unit, loss=loss, shown=shown, **report.shown)

    def epoch_report(self, epoch: int, epochs: int, stats: list[Stats]) -> tuple[dict[str, Any], str]:
        """The report's history entry of a finished epoch, and its log line."""
        report = self.report(stats)
        entry = {self.period: epoch + 1, **report.epoch}
        return entry, self.epoch_line.format(epoch=epoch + 1, epochs=epochs, tail=report.tail, **report.epoch)

    def prepare(
        self, decoder: Decoder, shares: list[list[list[Unit]]], ctx: JobContext, parallel: Parallel = ONE_PROCESS
    ) -> None:
        """Work done once before the first step (the reference pass of dpo), shared among the ranks:
        ``shares[rank]`` is that rank's forwards, each a list of units, as it first runs them."""

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        """The [n] f32 loss of each unit, and its numbers for the report."""
        raise NotImplementedError


class Sft(Objective):
    name, unit = "sft", "example"

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        logps = _scored(decoder, units)
        losses = torch.stack([-logp.mean() for logp in logps])
        return losses, [{"loss": float(loss.detach()), "tokens": float(len(logp))} for loss, logp in zip(losses, logps)]


@dataclass
class Preference(Objective):
    """dpo or ipo against the frozen base."""

    beta: float
    loss: str = "dpo"
    unit: str = "pair"
    reference: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per pair index, the reference log-probabilities of its chosen and rejected sides."""

    @property
    def name(self) -> str:  # type: ignore[override]  # (a class attribute elsewhere; the loss chosen here)
        return self.loss

    def prepare(
        self, decoder: Decoder, shares: list[list[list[Unit]]], ctx: JobContext, parallel: Parallel = ONE_PROCESS
    ) -> None:
        """Score every pair under the frozen reference, each in the forward it is first trained in, so that
        with a fresh adapter (the identity) the first step's log-ratios are exactly zero."""
        if self.reference:
            return  # restored from a checkpoint
        total = sum(len(forward) for share in shares for forward in share)
        ctx.progress("reference", f"scoring {total} pairs under the frozen reference model", 0, total)
        mine: dict[int, tuple[float, float]] = {}
        done = 0
        with torch.no_grad():
            for round_ in range(max(len(share) for share in shares)):  # one forward per rank per round
                if parallel.any(ctx.cancel.is_set()):
                    raise Cancelled()
                own = shares[parallel.rank]
                if round_ < len(own):
                    logps = _scored(decoder, own[round_], adapters=False)
                    for i, unit in enumerate(own[round_]):
                        mine[unit.index] = (float(logps[2 * i].sum()), float(logps[2 * i + 1].sum()))
                for _ in range(sum(len(share[round_]) for share in shares if round_ < len(share))):
                    done += 1
                    ctx.progress("reference", f"reference pair {done}/{total}", done, total)
        for scored in parallel.everyone(mine):
            self.reference.update(scored)

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        logps = _scored(decoder, units)
        losses, stats = [], []
        for i, unit in enumerate(units):
            chosen, rejected = logps[2 * i].sum(), logps[2 * i + 1].sum()
            ref_c, ref_r = self.reference[unit.index]
            ratio_c, ratio_r = chosen - ref_c, rejected - ref_r
            if self.loss == "ipo":
                ratio_c, ratio_r = ratio_c / len(logps[2 * i]), ratio_r / len(logps[2 * i + 1])
                loss = (ratio_c - ratio_r - 1 / (2 * self.beta)) ** 2
            else:
                loss = F.softplus(-self.beta * (ratio_c - ratio_r))
            reward_c, reward_r = self.beta * float(ratio_c.detach()), self.beta * float(ratio_r.detach())
            losses.append(loss)
            stats.append(
                {
                    "loss": float(loss.detach()),
                    "chosen_reward": reward_c,
                    "rejected_reward": reward_r,
                    "correct": float(reward_c > reward_r),
                }
            )
        return torch.stack(losses), stats

    def report(self, stats: list[Stats]) -> Report:
        """Accuracy on the step's line; the mean reward margin, β·(chosen log-ratio − rejected log-ratio), in its
        progress data; both and the mean rewards in the run's report."""
        chosen = mean(s["chosen_reward"] for s in stats)
        rejected = mean(s["rejected_reward"] for s in stats)
        accuracy, margin = mean(s["correct"] for s in stats), chosen - rejected
        summary = {
            "accuracy": accuracy,
            "mean_reward_margin": margin,
            "mean_chosen_reward": chosen,
            "mean_rejected_reward": rejected,
        }
        return Report(
            shown={"accuracy": accuracy},
            data={"reward_margin": margin},
            summary=summary,
            epoch={"mean_loss": mean(s["loss"] for s in stats), **summary},
            tail=f" accuracy {accuracy:.3f} reward margin {margin:.4f}",
        )


class Reward(Objective):
    """Bradley–Terry on a scalar head read from the final-normed last state."""

    name, unit = "reward", "pair"

    def __init__(self, head: Tensor) -> None:
        self.head = head  # [1, D] f32 parameter

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        hidden, tree = forward_tree(decoder, rows_of(units))
        scores = self.score(tree_last_states(decoder, hidden, tree))  # chosen, rejected, chosen, ...
        chosen, rejected = scores[0::2], scores[1::2]
        losses = F.softplus(-(chosen - rejected))
        stats = [
            {
                "loss": float(loss.detach()),
                "chosen_score": float(c.detach()),
                "rejected_score": float(r.detach()),
                "correct": float(c > r),
                "tied": float(c == r),
            }
            for loss, c, r in zip(losses, chosen, rejected)
        ]
        return losses, stats

    def score(self, states: Tensor) -> Tensor:
        """The f32 score [N] of final-normed states [N, D]: the head read at its own f32."""
        return (states.float() @ self.head.T)[:, 0]

    def report(self, stats: list[Stats]) -> Report:
        """Accuracy on the step's line; the mean score margin, the head's chosen − rejected score, in its progress
        data; both, the tied pairs and the mean scores in the run's report."""
        chosen = mean(s["chosen_score"] for s in stats)
        rejected = mean(s["rejected_score"] for s in stats)
        accuracy, margin = mean(s["correct"] for s in stats), chosen - rejected
        summary = {
            "accuracy": accuracy,
            "tied_pairs": int(sum(s["tied"] for s in stats)),
            "mean_chosen_score": chosen,
            "mean_rejected_score": rejected,
            "mean_score_margin": margin,
        }
        return Report(
            shown={"accuracy": accuracy},
            data={"score_margin": margin},
            summary=summary,
            epoch={"mean_loss": mean(s["loss"] for s in stats), **summary},
            tail=f" accuracy {accuracy:.3f} score margin {margin:.4f}",
        )


def mean(values: Iterable[float]) -> float:
    """The mean of ``values`` summed exactly (math.fsum); 0 for none."""
    values = list(values)
    return math.fsum(values) / len(values) if values else 0.0
