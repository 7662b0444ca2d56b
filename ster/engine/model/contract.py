"""What the jobs may ask of a decoder, whichever runs the model: Ster's own or transformers' behind it.

Reading, steering, training, scoring and decoding are written once, against :class:`Decoder`.
Two classes satisfy it: :class:`ster.engine.model.decoder.SterDecoder`, for the families Ster
runs itself, and :class:`ster.engine.model.generic.GenericDecoder`, for any other causal LM that
transformers loads. The value types a forward takes and gives (:class:`Layout`,
:class:`ForwardOutput`) live here too, so neither implementation imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

from ster.engine.model.adapters.factors import FactorHost
from ster.engine.model.config import DecoderConfig

Vocab = Literal["none", "last", "all"]
"""How much of the vocabulary projection a forward computes: none, the last position, every position."""


@dataclass(frozen=True)
class Layout:
    """Explicit positions and attention for a packed forward, overriding the causal default.

    Used to run several sequences that share a prefix as one row: each token carries its
    own position, and the mask says which keys it may see.
    """

    positions: Tensor
    """[B, T] rotary position of every token."""
    mask: Tensor
    """[B, 1, T, T] boolean: may query i see key j."""


@dataclass(frozen=True)
class ForwardOutput:
    hidden: Tensor
    """[B, T, D] residual stream after the last block run (before the final norm)."""
    logits: Tensor | None
    """f32 logits: [B, V] for ``last``, [B, T, V] for ``all``, None for ``none``."""

    def require_logits(self) -> Tensor:
        """The logits of a forward that computed them (``vocab`` other than ``none``)."""
        if self.logits is None:
            raise ValueError("this forward computed no logits (vocab='none')")
        return self.logits


def positions(ids: Tensor, past: int, key_mask: Tensor | None) -> Tensor:
    """Position of every new token [B, T]: its index among the real tokens before it."""
    batch, length = ids.shape
    if key_mask is None:
        return torch.arange(past, past + length, device=ids.device).expand(batch, length)
    real_before = key_mask.long().cumsum(dim=1) - 1  # [B, S]
    return real_before[:, past : past + length].clamp(min=0)


def checked_depth(count: int, depth: int | None, vocab: Vocab) -> int:
    """How many of ``count`` blocks a forward runs (all when ``depth`` is None); logits need every block."""
    depth = count if depth is None else depth
    if depth < count and vocab != "none":
        raise ValueError("a forward that stops before the last block computes no logits")
    return depth


class Cache(Protocol):
    """A KV cache a decoding loop grows: how many positions it holds, and the row operations of a group."""

    length: int

    def take_prefix(self, alone: Any, count: int) -> None:
        """Become ``alone``'s single-row cache repeated for ``count`` rows (a group's shared prefill)."""

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only the cache rows ``rows``."""


class Decoder(Protocol):
    """A causal language model as the jobs drive it.

    ``blocks`` are its decoder layers: a forward hook on one reads (or replaces) the residual stream
    after it, which is how reading and steering work on both implementations. A LoRA factor attached to
    ``lora_module(layer, projection).lora[projection]`` applies in every forward with ``adapters`` true.
    """

    config: DecoderConfig

    @property
    def blocks(self) -> nn.ModuleList: ...

    @property
    def lm_head(self) -> nn.Linear:
        """The output head, whose weight says the model's dtype and device."""

    def __call__(
        self,
        ids: Tensor,
        *,
        cache: Any = None,
        key_mask: Tensor | None = None,
        depth: int | None = None,
        vocab: Vocab = "last",
        layout: Layout | None = None,
        adapters: bool = True,
        start: tuple[int, Tensor] | None = None,
    ) -> ForwardOutput:
        """Run ``ids`` [B, T] through the first ``depth`` blocks (see :meth:`SterDecoder.forward`)."""

    def new_cache(self, batch: int, max_len: int) -> Any:
        """An empty cache for ``batch`` rows of up to ``max_len`` positions (a :class:`Cache`)."""

    def final_norm(self, h: Tensor) -> Tensor:
        """The final norm of residual states [..., D]: what the output head (or a reward head) reads."""

    def project(self, h: Tensor) -> Tensor:
        """f32 logits [..., V] of residual states taken before the final norm."""

    def write_gains(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """The scale each write of a block (the attention's, the MLP's) is multiplied by after its norm, before it
        is added (Gemma's sandwich norms); None where a write is added as it is."""

    def edited_writes(
        self, layers: list[int], edit: Callable[[int, int, Tensor], Tensor]
    ) -> AbstractContextManager[None]:
        """Each write of the listed blocks passes ``edit(layer, which, write)`` (0 the attention's, 1 the MLP's)
        before it is normalised and added to the stream, for the duration of the block."""

    def lora_module(self, layer: int, projection: str) -> FactorHost:
        """The module of ``layer`` that holds ``projection`` and its attached LoRA factors."""

    def prepare(self) -> Decoder:
        """Freeze and ready the loaded weights; returns the decoder."""

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]: ...

    def modules(self) -> Iterator[nn.Module]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...
