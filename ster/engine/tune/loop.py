"""The training loop every objective shares: order, batching, accumulation, schedule, AdamW, checkpoints.

One optimizer step takes ``batch × accumulation`` units from the epoch's order (shuffled
by ``random.Random(seed + epoch)``), stably sorts them by descending length when the
batch holds more than one, cuts them into forwards of ``batch`` units, runs consecutive
forwards as one while their rows packed along shared prefixes fit in
:data:`~ster.engine.tune.rows.PACK_TOKENS` (the step's gradient is the same either way),
and folds their losses into one AdamW step; each unit's loss is divided by the constant
``batch × accumulation``, so a short tail step is proportionally smaller. The learning rate ramps
linearly over the warmup steps and then decays on a cosine to a tenth of the base rate.

Between steps the loop checks the job's cancel flag: a cancelled run saves a
checkpoint (see :mod:`ster.engine.tune.checkpoint`) and stops with a sentence saying
where it is; ``--checkpoint-every N`` saves one every N steps as well. ``--resume``
restores the loop's :class:`LoopState` and AdamW's moments from it and ends where an
uninterrupted run would, byte for byte. Under ``torchrun`` each rank runs its share of
every step's forwards, the gradients are summed across ranks before the step, and the
ranks stop together (see :mod:`ster.engine.tune.parallel`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag
from ster.engine.tune.objectives import Objective, Place, Stats, Unit, rows_of
from ster.engine.tune.parallel import Parallel
from ster.engine.tune.rows import fuse


@dataclass(frozen=True)
class Settings:
    epochs: int
    batch: int
    accumulation: int
    learning_rate: float
    warmup_steps: int
    seed: int
    checkpoint_every: int = 0


def learning_rate(base: float, step: int, warmup: int, total: int) -> float:
    """The rate of optimizer step ``step`` (0-based): linear warmup, then cosine to base / 10."""
    if step < warmup:
        return base * (step + 1) / warmup
    floor = base / 10
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class LoopState:
    """What the loop has done, in plain numbers: enough to resume and to report."""

    step: int = 0
    """Optimizer steps done."""
    first_loss: float | None = None
    final_loss: float | None = None
    epoch_stats: list[Stats] = field(default_factory=list)
    """Per-unit numbers of the epoch in progress (or, once the run ends, of the final epoch)."""
    epoch_history: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Loop:
    """Runs an objective over its units with an adapter's tensors as the only trainable parameters."""

    def __init__(
        self,
        decoder: Decoder,
        params: list[Tensor],
        objective: Objective,
        units: list[Unit],
        settings: Settings,
        ctx: JobContext,
        parallel: Parallel,
    ) -> None:
        self.decoder, self.params, self.objective, self.units = decoder, params, objective, units
        self.settings, self.ctx, self.parallel = settings, ctx, parallel
        self.per_step = settings.batch * settings.accumulation
        self.steps_per_epoch = math.ceil(len(units) / self.per_step)
        self.total = self.steps_per_epoch * settings.epochs
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate)
        self.state = LoopState()

    def restore(self, state: dict[str, Any], optimizer: dict[str, Any]) -> None:
        self.state = LoopState(**state)
        self.optimizer.load_state_dict(optimizer)

    def run(self, save_checkpoint: Callable[[Loop], str]) -> LoopState:
        """Train to the last step; on cancel, save a checkpoint and raise ``Cancelled`` saying where it is.

        ``save_checkpoint`` writes one (on the writing rank) and returns its path.
        """
        from ster.engine.protocol.errors import Cancelled

        while self.state.step < self.total:
            if self.parallel.any(self.ctx.cancel.is_set()):  # every rank stops before the same step
                where = save_checkpoint(self)
                raise Cancelled(
                    f"cancelled after step {self.state.step} of {self.total}; the checkpoint at {where} "
                    f"continues it when the same command is given with {flag('resume')}",
                    {"step": self.state.step, "total": self.total, "checkpoint": str(where)},
                )
            self._step()
            every = self.settings.checkpoint_every
            if every and self.state.step % every == 0 and self.state.step < self.total:
                where = save_checkpoint(self)
                self.ctx.log(f"checkpoint after step {self.state.step} written to {where}")
        return self.state

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.units)))
        random.Random(self.settings.seed + epoch).shuffle(order)
        return order

    def _forwards(self, step: int) -> list[list[Unit]]:
        epoch, within = divmod(step, self.steps_per_epoch)
        picked = [self.units[i] for i in self._order(epoch)[within * self.per_step : (within + 1) * self.per_step]]
        if self.settings.batch > 1:
            picked = sorted(picked, key=lambda unit: -unit.length)  # stable: equal lengths keep their order
        return [picked[i : i + self.settings.batch] for i in range(0, len(picked), self.settings.batch)]

    def _groups(self, step: int) -> list[list[tuple[int, list[Unit]]]]:
        """The step's forwards, numbered, consecutive ones joined while they pack within
        :data:`~ster.engine.tune.rows.PACK_TOKENS`. Each group runs as one forward, group ``g`` on rank
        ``g % world``, so every world size computes the same forwards."""
        numbered = list(enumerate(self._forwards(step)))
        if not self.objective.fusable:
            return [[forward] for forward in numbered]
        return fuse(numbered, lambda forward: rows_of(forward[1]))

    def first_epoch(self) -> list[list[list[Unit]]]:
        """Per rank, the units of each forward it runs in the first epoch (what the reference pass scores)."""
        world, steps = self.parallel.world, range(min(self.steps_per_epoch, self.total))
        groups = [
            (g, [unit for _, units in group for unit in units])
            for step in steps
            for g, group in enumerate(self._groups(step))
        ]
        return [[units for g, units in groups if g % world == rank] for rank in range(world)]

    def _step(self) -> None:
        started = time.perf_counter()
        state, step = self.state, self.state.step
        epoch, within = divmod(step, self.steps_per_epoch)
        forwards = self._forwards(step)
        self.objective.begin(epoch)
        stats: list[tuple[int, list[Stats]]] = []
        for _, group in self.parallel.share(self._groups(step)):
            losses, unit_stats = self.objective.losses(self.decoder, [unit for _, units in group for unit in units])
            (losses.sum() / self.per_step).backward()
            for number, units in group:  # each forward's numbers under its own number, as every rank orders them
                stats.append((number, unit_stats[: len(units)]))
                unit_stats = unit_stats[len(units) :]
        step_stats = self.parallel.gather(stats)
        self.parallel.reduce_gradients(self.params)
        rate = learning_rate(self.settings.learning_rate, step, self.settings.warmup_steps, self.total)
        for settings in self.optimizer.param_groups:
            settings["lr"] = rate
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if within == 0:
            state.epoch_stats = []
        state.epoch_stats.extend(step_stats)
        loss = math.fsum(s["loss"] for s in step_stats) / len(step_stats)
        state.first_loss = loss if state.first_loss is None else state.first_loss
        state.final_loss = loss
        state.step = step + 1
        elapsed = time.perf_counter() - started
        tokens = self.objective.step_tokens([unit for units in forwards for unit in units], step_stats)
        state.tokens, state.seconds = state.tokens + tokens, state.seconds + elapsed
        self._report_step(epoch, within, loss, rate, tokens / elapsed, step_stats)
        if within == self.steps_per_epoch - 1:
            self._report_epoch(epoch)

    def _report_step(self, epoch: int, within: int, loss: float, rate: float, speed: float, stats: list[Stats]) -> None:
        done = min((within + 1) * self.per_step, len(self.units))
        place = Place(
            epoch + 1,
            self.settings.epochs,
            within + 1,
            self.steps_per_epoch,
            epoch * self.steps_per_epoch + within + 1,
            self.settings.epochs * self.steps_per_epoch,
            done,
            len(self.units),
        )
        report = self.objective.report(stats)
        self.ctx.progress(
            "train",
            self.objective.step_message(place, loss, report),
            self.state.step,
            self.total,
            {
                "epoch": epoch + 1,
                "loss": loss,
                "learning_rate": rate,
                "tokens_per_second": speed,
                **report.shown,
                **report.data,
            },
        )

    def _report_epoch(self, epoch: int) -> None:
        entry, line = self.objective.epoch_report(epoch, self.settings.epochs, self.state.epoch_stats)
        self.state.epoch_history.append(entry)
        self.ctx.log(line)
