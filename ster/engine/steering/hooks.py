"""Forward hooks on decoder blocks, always inside context managers that remove them.

A block's output is the residual stream after that block. Reading it and (later)
adding a steering direction to it are both hooks on the block module, so the
decoder itself carries no reading or steering code and a run without hooks pays
nothing for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from ster.engine.model.contract import Decoder


@contextmanager
def record_blocks(model: Decoder, layers: list[int]) -> Iterator[dict[int, Tensor]]:
    """Yield a dict that each forward fills with the [B, T, D] output of every listed block."""
    seen: dict[int, Tensor] = {}
    handles = []

    def hook_for(layer: int):  # noqa: ANN202 - a forward hook's signature is torch's
        def hook(module: nn.Module, args: tuple, output: Tensor | tuple) -> None:
            seen[layer] = output[0] if isinstance(output, tuple) else output  # (a transformers layer's tuple)

        return hook

    try:
        for layer in layers:
            handles.append(model.blocks[layer].register_forward_hook(hook_for(layer)))
        yield seen
    finally:
        for handle in handles:
            handle.remove()
