"""Adding a direction to the residual stream while the model runs.

A steering plan holds, per layer, ``scale × direction`` (the strength at that layer) already cast to the
model's dtype and device. Applying it is a forward hook on each block that adds the
vector to the block's output at every position of every forward — the prompt's and
each new token's — and the hooks are removed in ``finally`` whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.model.hooks import added


def plan(model: Decoder, vectors: dict[int, list[float]], scales: dict[int, float]) -> dict[int, Tensor]:
    """Per layer, ``scales[layer] × vector`` in the model's dtype and on its device."""
    weight = model.lm_head.weight
    return {
        layer: (torch.tensor(vector, dtype=torch.float32) * scales[layer]).to(weight.device, weight.dtype)
        for layer, vector in vectors.items()
    }


@contextmanager
def steer(model: Decoder, additions: dict[int, Tensor]) -> Iterator[None]:
    """Add ``additions[layer]`` to the output of each listed block for the duration of the block."""
    with added(model, list(additions), additions.__getitem__):
        yield


class RowSteering:
    """Per-row additions for a batch decoded together: ``additions[layer]`` is [B, D], one row per sequence,
    and :meth:`select` follows the batch as rows leave it (the group decoder's ``select_rows``)."""

    def __init__(self, additions: dict[int, Tensor]) -> None:
        self.full = additions
        self.current = {layer: rows[:, None, :] for layer, rows in additions.items()}  # [B, 1, D]

    def select(self, rows: Tensor) -> None:
        self.current = {layer: full.index_select(0, rows)[:, None, :] for layer, full in self.full.items()}

    def applied(self, model: Decoder) -> AbstractContextManager[None]:
        """Add the current rows' vectors to the output of each listed block, every position."""
        return added(model, list(self.full), lambda layer: self.current[layer])
