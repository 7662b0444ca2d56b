"""Forward hooks on decoder blocks, always inside context managers that remove them.

A block's output is the residual stream after that block. Reading it, adding a steering
direction to it, and stopping transformers' model once the deepest block a read needs has
run are all hooks on the block module, so neither decoder carries reading or steering code
and a run without hooks pays nothing for them. A transformers layer returns a tuple whose
first element is the stream; Ster's blocks return the stream itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from ster.engine.model.contract import Decoder

BlockOutput = Tensor | tuple[Any, ...]
Hook = Callable[[nn.Module, tuple[Any, ...], Any], Any]


def stream(output: BlockOutput) -> Tensor:
    """The residual stream in a block's output."""
    return output[0] if isinstance(output, tuple) else output


def with_stream(output: BlockOutput, new: Tensor) -> BlockOutput:
    """A block's output with its residual stream replaced by ``new``, in the output's own form."""
    return (new, *output[1:]) if isinstance(output, tuple) else new


@contextmanager
def hooked(modules: list[nn.Module], hooks: list[Hook]) -> Iterator[None]:
    """Each of ``hooks`` a forward hook on its module for the duration of the block, removed whatever happens."""
    handles = []
    try:
        for module, hook in zip(modules, hooks, strict=True):
            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def record_blocks(model: Decoder, layers: list[int]) -> Iterator[dict[int, Tensor]]:
    """Yield a dict that each forward fills with the [B, T, D] output of every listed block."""
    seen: dict[int, Tensor] = {}

    def hook_for(layer: int) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: BlockOutput) -> None:
            seen[layer] = stream(output)

        return hook

    with hooked([model.blocks[layer] for layer in layers], [hook_for(layer) for layer in layers]):
        yield seen


@contextmanager
def added(model: Decoder, layers: list[int], addition: Callable[[int], Tensor]) -> Iterator[None]:
    """Forward hooks adding ``addition(layer)`` (read at each forward) to each listed block's output."""

    def hook_for(layer: int) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: BlockOutput) -> BlockOutput:
            return with_stream(output, stream(output) + addition(layer))

        return hook

    with hooked([model.blocks[layer] for layer in layers], [hook_for(layer) for layer in layers]):
        yield
