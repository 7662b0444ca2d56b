"""One projection's LoRA update and how it is added to that projection's output, on either decoder.

Ster's decoder adds it inside its own linear layers (:mod:`ster.engine.model.linear`);
transformers' model adds it from a forward hook on each projection (:mod:`ster.engine.model.generic`).
Both go through :func:`add_piece_updates`, so the two produce the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class LoraFactors:
    """One projection's low-rank update ``scale · B (A x)``: A [rank, in] and B [out, rank], f32 parameters.

    A batch whose rows go through different adapters (a server's) stacks their factors along the rank: ``ranks``
    [rows, 1, rank] keeps each row's own adapter's share of ``A x`` (1) and drops the others' (0), and
    ``row_scale`` [rows, 1, 1] is each row's adapter's scale (0 for a row through none), in place of ``scale``."""

    a: Tensor
    b: Tensor
    scale: float
    ranks: Tensor | None = None
    row_scale: Tensor | None = None


class FactorHost(Protocol):
    """A module of a block that LoRA factors attach to (its attention or its MLP), on either decoder: the
    factors by projection name, and its fused weight where its projections are views of one."""

    lora: dict[str, LoraFactors]
    fused_weight: Tensor | None

    def named_children(self) -> Iterator[tuple[str, nn.Module]]: ...


NO_FACTORS: dict[str, LoraFactors] = {}
"""What a forward with ``adapters=False`` reads in place of a module's attached factors."""


def lora_update(x: Tensor, lora: LoraFactors) -> Tensor:
    """``scale · B (A x)``, the factors cast to the activations' dtype so gradients still flow back to f32; row by
    row with a stacked batch's ``ranks`` and ``row_scale``."""
    inner = F.linear(x, lora.a.to(x.dtype))
    if lora.ranks is not None:
        inner = inner * lora.ranks.to(x.dtype)
    out = F.linear(inner, lora.b.to(x.dtype))
    if lora.row_scale is not None:
        return out * lora.row_scale.to(x.dtype)
    return lora.scale * out


def add_piece_updates(
    x: Tensor, y: Tensor, names: tuple[str, ...] | list[str], widths: list[int], lora: dict[str, LoraFactors]
) -> Tensor:
    """``y``, the output of projections ``names`` stacked along its last dimension (``widths`` each), with each
    attached projection's LoRA update of ``x`` added to its own share."""
    if len(names) == 1:
        return y + lora_update(x, lora[names[0]])
    parts = list(torch.split(y, widths, dim=-1))
    for i, name in enumerate(names):
        if name in lora:
            parts[i] = parts[i] + lora_update(x, lora[name])
    return torch.cat(parts, dim=-1)
