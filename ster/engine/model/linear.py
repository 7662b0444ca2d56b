"""Ster's decoder's linear projections on this machine's chosen CPU kernels, with attached LoRA updates.

A projection is ``x @ weight.T + bias`` on the kernel :mod:`ster.engine.model.kernels` timed fastest for
its precision and row count. :func:`fuse` lays a block's q/k/v (and gate/up) weights out as one tensor,
of which each projection's weight is a view, so :func:`fused_linear` runs them as one matmul while the
parameter names and the memory stay as the checkpoint has them. Weights quantized to int8 are torchao
tensors, run and concatenated by :mod:`ster.engine.model.quantize`.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ster.engine.model.adapters.factors import LoraFactors, add_piece_updates, lora_update
from ster.engine.model.kernels import PLAIN, matmul


def linear(x: Tensor, layer: nn.Linear, lora: LoraFactors | None = None) -> Tensor:
    """``layer`` applied to ``x``, plus its attached LoRA update when there is one."""
    # Called directly rather than through nn.Module.__call__: at batch 1 a decode step
    # is a few hundred small ops, and the module call overhead would be a visible share.
    # The factors stay f32 parameters and are cast to the activations' dtype for the two
    # matmuls, so gradients flow back to f32; with B zero the update adds exactly 0.
    y = matmul(x, layer.weight, layer.bias)
    if lora is None:
        return y
    return y + lora_update(x, lora)


class Fused(Protocol):
    """A module whose projections ``fuse`` laid out as views of one weight (and bias)."""

    fused_weight: Tensor | None
    fused_bias: Tensor | None


def fused_linear(x: Tensor, module: Fused, names: tuple[str, ...], lora: dict[str, LoraFactors]) -> Tensor:
    """The projections ``names`` of ``module`` as one matmul over their fused weight, outputs concatenated.

    :func:`fuse` made each projection's weight a view of ``module.fused_weight``, so this reads
    the same numbers as the separate projections would. Attached LoRA updates are added to
    their own projection's share of the output.
    """
    fused = module.fused_weight
    if fused is None:  # a decoder built without prepare(): the projections one by one
        return torch.cat([linear(x, getattr(module, name), lora.get(name)) for name in names], dim=-1)
    y = matmul(x, fused, module.fused_bias)
    if not lora or not any(name in lora for name in names):
        return y
    return add_piece_updates(x, y, names, [getattr(module, name).out_features for name in names], lora)


def fuse(module: nn.Module, names: tuple[str, ...]) -> None:
    """Lay the projections' weights (and biases) out as one tensor and make each a view of it."""
    layers: list[nn.Linear] = [getattr(module, name) for name in names]
    if len({layer.bias is None for layer in layers}) > 1:
        return  # some with a bias and some without: no fused bias to add, so they stay separate
    weights = [layer.weight for layer in layers]
    if type(weights[0]) not in PLAIN:
        from ster.engine.model.quantize import concatenate

        fused = concatenate(weights)
    else:
        fused = torch.cat([w.detach() for w in weights])
    _share(layers, "weight", fused)
    module.fused_weight = fused
    if layers[0].bias is not None:
        bias = torch.cat([layer.bias.detach() for layer in layers if layer.bias is not None])
        _share(layers, "bias", bias)
        module.fused_bias = bias


def _share(layers: list[nn.Linear], name: str, fused: Tensor) -> None:
    """Make each layer's ``name`` (weight or bias) the view of its own rows of ``fused``."""
    start = 0
    for layer in layers:
        end = start + layer.out_features
        setattr(layer, name, nn.Parameter(fused[start:end], requires_grad=False))
        start = end


def embed(ids: Tensor, table: Tensor) -> Tensor:
    """The embedding rows of ``ids``; a quantized table dequantizes just those rows."""
    if type(table) not in PLAIN:
        from ster.engine.model.quantize import quantized_embedding

        return quantized_embedding(ids, table)
    return F.embedding(ids, table)
