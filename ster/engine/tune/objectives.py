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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ster.engine.model.llama import Decoder
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

    def step_message(self, epoch: int, epochs: int, within: int, steps: int, done: int, units: int, loss: float,
                     extra: dict[str, float]) -> str:
        """The progress line of a step (``within`` counts from 0 in its epoch; ``done`` units of ``units``)."""
        tail = "".join(f" {name} {value:.3f}" for name, value in extra.items())
        return (f"epoch {epoch + 1}/{epochs} step {epoch * steps + within + 1}/{epochs * steps} "
                f"{self.unit} {done}/{units} loss {loss:.4f}{tail}")

    def epoch_report(self, epoch: int, epochs: int, stats: list[Stats]) -> tuple[dict[str, Any], str]:
        """The report's history entry of a finished epoch, and its log line."""
        mean = _mean(s["loss"] for s in stats)
        return ({"epoch": epoch + 1, "mean_loss": mean, **self.summary(stats)},
                f"epoch {epoch + 1}/{epochs} mean loss {mean:.4f}" + self.epoch_line(stats))

    def prepare(self, decoder: Decoder, shares: list[list[list[Unit]]], ctx: JobContext,
                parallel: Parallel = ONE_PROCESS) -> None:
        """Work done once before the first step (the reference pass of dpo), shared among the ranks:
        ``shares[rank]`` is that rank's forwards, each a list of units, as it first runs them."""

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        """The [n] f32 loss of each unit, and its numbers for the report."""
        raise NotImplementedError

    def progress_extra(self, stats: list[Stats]) -> dict[str, float]:
        """What a step's line shows besides the loss (dpo: accuracy)."""
        return {}

    def progress_data(self, stats: list[Stats]) -> dict[str, float]:
        """What a step's progress data carries besides its line's values (dpo: the mean reward margin),
        from the numbers the step already has; the line itself stays as the contract writes it."""
        return {}

    def summary(self, stats: list[Stats]) -> dict[str, Any]:
        """The report's objective-specific fields, from the final epoch's per-unit numbers."""
        return {}

    def epoch_line(self, stats: list[Stats]) -> str:
        return ""


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
    def name(self) -> str:  # type: ignore[override]
        return self.loss

    def prepare(self, decoder: Decoder, shares: list[list[list[Unit]]], ctx: JobContext,
                parallel: Parallel = ONE_PROCESS) -> None:
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
            stats.append({"loss": float(loss.detach()), "chosen_reward": reward_c, "rejected_reward": reward_r,
                          "correct": float(reward_c > reward_r)})
        return torch.stack(losses), stats

    def progress_extra(self, stats: list[Stats]) -> dict[str, float]:
        return {"accuracy": _mean(s["correct"] for s in stats)}

    def progress_data(self, stats: list[Stats]) -> dict[str, float]:
        """The step's mean reward margin, β·(chosen log-ratio − rejected log-ratio) over its pairs."""
        return {"reward_margin": _mean(s["chosen_reward"] - s["rejected_reward"] for s in stats)}

    def summary(self, stats: list[Stats]) -> dict[str, Any]:
        chosen = _mean(s["chosen_reward"] for s in stats)
        rejected = _mean(s["rejected_reward"] for s in stats)
        return {"accuracy": _mean(s["correct"] for s in stats), "mean_reward_margin": chosen - rejected,
                "mean_chosen_reward": chosen, "mean_rejected_reward": rejected}

    def epoch_line(self, stats: list[Stats]) -> str:
        summary = self.summary(stats)
        return f" accuracy {summary['accuracy']:.3f} reward margin {summary['mean_reward_margin']:.4f}"


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
        stats = [{"loss": float(loss.detach()), "chosen_score": float(c.detach()), "rejected_score": float(r.detach()),
                  "correct": float(c > r), "tied": float(c == r)}
                 for loss, c, r in zip(losses, chosen, rejected)]
        return losses, stats

    def score(self, states: Tensor) -> Tensor:
        """The f32 score [N] of final-normed states [N, D]: the head read at its own f32."""
        return (states.float() @ self.head.T)[:, 0]

    def progress_extra(self, stats: list[Stats]) -> dict[str, float]:
        return {"accuracy": _mean(s["correct"] for s in stats)}

    def progress_data(self, stats: list[Stats]) -> dict[str, float]:
        """The step's mean score margin, the head's chosen score − rejected score over its pairs."""
        return {"score_margin": _mean(s["chosen_score"] - s["rejected_score"] for s in stats)}

    def summary(self, stats: list[Stats]) -> dict[str, Any]:
        chosen = _mean(s["chosen_score"] for s in stats)
        rejected = _mean(s["rejected_score"] for s in stats)
        return {"accuracy": _mean(s["correct"] for s in stats), "tied_pairs": int(sum(s["tied"] for s in stats)),
                "mean_chosen_score": chosen, "mean_rejected_score": rejected, "mean_score_margin": chosen - rejected}

    def epoch_line(self, stats: list[Stats]) -> str:
        summary = self.summary(stats)
        return f" accuracy {summary['accuracy']:.3f} score margin {summary['mean_score_margin']:.4f}"


def _mean(values: Any) -> float:
    values = list(values)
    return math.fsum(values) / len(values) if values else 0.0
