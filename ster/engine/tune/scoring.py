"""The torch side of ``tune evaluate``: completion log-probabilities, implicit rewards and reward scores.

:mod:`ster.engine.tune.evaluate` checks every input (the data, each sequence against the
limit, the adapter) before it imports this module. Everything here runs under
``inference_mode`` with the adapter already attached; nothing records a gradient. A batch
right-pads its rows and masks the padding out (see :mod:`ster.engine.tune.rows`), so a
batched evaluation equals one example at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.encoding import Sequence
from ster.engine.tune.objectives import Objective, Preference, Reward, Stats, Unit
from ster.engine.tune.rows import forward_rows, token_logprobs

T = TypeVar("T")


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def completion_nlls(
    decoder: Decoder,
    sequences: list[Sequence],
    batch: int,
    check_cancelled: Callable[[], None],
    on_example: Callable[[int, float, int], None],
) -> list[tuple[float, int]]:
    """Per sequence, in order, the f64 negative log-likelihood of its completion tokens and their count.

    ``on_example(i, nll, tokens)`` is called as each one is scored (``i`` its position in ``sequences``).
    """
    scored: list[tuple[float, int]] = []
    with torch.inference_mode():
        for chunk in _chunks(sequences, batch):
            check_cancelled()
            rows, starts = [seq.ids for seq in chunk], [seq.boundary for seq in chunk]
            logps = token_logprobs(decoder, forward_rows(decoder, rows), rows, starts)
            for logp in logps:
                nll, tokens = -float(logp.double().sum()), len(logp)
                on_example(len(scored), nll, tokens)
                scored.append((nll, tokens))
    return scored


def pair_stats(
    objective: Objective,
    decoder: Decoder,
    units: list[Unit],
    batch: int,
    ctx: JobContext,
    on_pair: Callable[[int, Stats], None],
) -> list[Stats]:
    """Each pair's numbers under a training objective's own scoring (its loss, rewards or scores, whether
    the chosen side won), without a gradient; the objective's reference pass first (dpo)."""
    stats: list[Stats] = []
    with torch.inference_mode():
        objective.prepare(decoder, [list(_chunks(units, batch))], ctx)
        for chunk in _chunks(units, batch):
            ctx.check_cancelled()
            for numbers in objective.losses(decoder, chunk)[1]:
                on_pair(len(stats), numbers)
                stats.append(numbers)
    return stats


def implicit_reward(beta: float, loss: str) -> Preference:
    """DPO's (or IPO's) implicit reward, beta times the log-ratio of the adapted model to the bare checkpoint."""
    return Preference(beta=beta, loss=loss)


def reward_model(head: Tensor | None) -> Reward:
    assert head is not None, "a reward artifact is checked to carry reward.head"
    return Reward(head)
