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
PreHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]
INPUT = -1
"""The site of :func:`edited` before the first block: the stream the first block receives (the embedding's
output, scaled as the family scales it)."""


def stream(output: BlockOutput) -> Tensor:
    """The residual stream in a block's output."""
    return output[0] if isinstance(output, tuple) else output


def with_stream(output: BlockOutput, new: Tensor) -> BlockOutput:
    """A block's output with its residual stream replaced by ``new``, in the output's own form."""
    return (new, *output[1:]) if isinstance(output, tuple) else new


@contextmanager
def hooked(
    modules: list[nn.Module], hooks: list[Hook], entering: dict[nn.Module, PreHook] | None = None
) -> Iterator[None]:
    """Each of ``hooks`` a forward hook on its module, and each of ``entering`` a hook on its module's input, for the
    duration of the block, removed whatever happens."""
    handles = []
    try:
        for module, hook in zip(modules, hooks, strict=True):
            handles.append(module.register_forward_hook(hook))
        for module, pre in (entering or {}).items():
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
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
def edited(model: Decoder, sites: list[int], edit: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
    """Hooks replacing the stream at each of ``sites`` with ``edit(site, stream)``: after each listed block, and
    with :data:`INPUT`, the stream entering the first block (its first argument, or ``hidden_states``)."""

    def hook_for(site: int) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: BlockOutput) -> BlockOutput:
            return with_stream(output, edit(site, stream(output)))

        return hook

    def entering(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (edit(INPUT, args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": edit(INPUT, kwargs["hidden_states"])}

    blocks = [site for site in sites if site != INPUT]
    first: dict[nn.Module, PreHook] | None = {model.blocks[0]: entering} if INPUT in sites else None
    with hooked([model.blocks[site] for site in blocks], [hook_for(site) for site in blocks], first):
        yield


@contextmanager
def added(model: Decoder, layers: list[int], addition: Callable[[int], Tensor]) -> Iterator[None]:
    """Forward hooks adding ``addition(layer)`` (read at each forward) to each listed block's output."""
    with edited(model, layers, lambda layer, hidden: hidden + addition(layer)):
        yield
