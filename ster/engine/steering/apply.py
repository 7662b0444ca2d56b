"""Adding a direction to the residual stream while the model runs.

A steering plan holds, per layer, ``scale × direction`` (the strength at that layer) already cast to the
model's dtype and device. Applying it is a forward hook on each block that adds the
vector to the block's output at every position of every forward — the prompt's and
each new token's — and the hooks are removed in ``finally`` whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ster.engine.model.llama import Decoder


def plan(model: Decoder, vectors: dict[int, list[float]], scales: dict[int, float]) -> dict[int, Tensor]:
    """Per layer, ``scales[layer] × vector`` in the model's dtype and on its device."""
    weight = model.lm_head.weight
    return {layer: (torch.tensor(vector, dtype=torch.float32) * scales[layer]).to(weight.device, weight.dtype)
            for layer, vector in vectors.items()}


@contextmanager
def steer(model: Decoder, additions: dict[int, Tensor]) -> Iterator[None]:
    """Add ``additions[layer]`` to the output of each listed block for the duration of the block."""
    handles = []

    def hook_for(addition: Tensor):  # noqa: ANN202 - a forward hook's signature is torch's
        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            return output + addition

        return hook

    try:
        for layer, addition in additions.items():
            handles.append(model.blocks[layer].register_forward_hook(hook_for(addition)))
        yield
    finally:
        for handle in handles:
            handle.remove()
