"""Weight-only int8 for the frozen base (``--precision int8``), through torchao.

Each projection's weight, the output head and the embedding table are quantized per row
(symmetric, one f32 scale per output channel) into torchao's ``Int8Tensor`` as they are
read from the checkpoint, so a model is never held whole at f32. Everything else stays
f32: norms, the residual stream, the KV cache, rotary, attention and the logits. LoRA
factors, a reward head and optimizer state are f32 as at every precision; gradients
reach a factor through the quantized projection's input (the weight is frozen), which is
what QLoRA does.

Two paths run an int8 product (:mod:`ster.engine.model.kernels` times them on the machine and picks
one per class of row count; these are the defaults):

- up to eight rows that need no gradient (a decode step, a group's) go to PyTorch's own CPU
  int8-weight kernel, ``aten._weight_int8pack_mm``. Its fast path takes bf16 activations
  and bf16 scales (with f32 ones it falls back to a loop 25 times slower), so those rows'
  input and the product are rounded to bf16 once each. The scales are chosen
  bf16-representable when the weights are quantized, so handing them to the kernel
  changes no number. torchao 0.18's own int8 linear converts the whole weight to f32 on
  every call, which at a few rows is several times slower than the f32 model it replaces;
- everything else — a prefill, reading activations, training and its backward — uses
  torchao's own linear (the weight dequantized to f32 inside an ordinary, differentiable
  matmul), so those run at f32 activations.

torchao is imported only here, and only when int8 is asked for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

Int8Weight = Any
"""torchao's ``Int8Tensor``: a Tensor subclass holding ``qdata`` (int8) and per-row ``scale``. torchao ships no
type information, so its values are typed as what they are to mypy, unknown."""


def int8_tensor_type() -> Any:
    """torchao's ``Int8Tensor`` (its import-time warnings are silenced in :mod:`ster.engine.model`)."""
    from torchao.quantization import Int8Tensor

    return Int8Tensor


def quantize(weight: Tensor) -> Int8Weight:
    """``weight`` [out, in] (any float dtype) as a per-row symmetric int8 torchao tensor.

    Each row's scale is torchao's symmetric one, ``max |w| / 127.5``, rounded up to the next
    bf16 number, so the int8 kernel can take it as it is (see the module's note); rounding
    up keeps every weight within the int8 range. Rows are independent under per-row scales, so a
    large tensor (an embedding table) is quantized a block of rows at a time: the f32 temporaries
    stay small whatever the vocabulary.
    """
    Int8Tensor = int8_tensor_type()
    from torchao.quantization.granularity import PerRow

    blocks = [
        Int8Tensor.from_hp(rows, PerRow(), scale=_bf16_scale(rows))
        for rows in (block.float() for block in torch.split(weight, _ROWS_AT_ONCE))
    ]
    return blocks[0] if len(blocks) == 1 else concatenate(blocks)


def _bf16_scale(rows: Tensor) -> Tensor:
    """Per-row symmetric scales [rows, 1] of f32 ``rows``, each the smallest bf16 number at or above torchao's."""
    exact = (rows.abs().amax(dim=1, keepdim=True) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
    rounded = exact.to(torch.bfloat16)
    up = torch.nextafter(rounded, torch.tensor(float("inf"), dtype=torch.bfloat16))
    return torch.where(rounded.float() < exact, up, rounded).float()


_ROWS_AT_ONCE = 4096


def concatenate(weights: list[Int8Weight]) -> Int8Weight:
    """Several per-row int8 weights stacked along their rows, as one int8 tensor (rows keep their scales)."""
    Int8Tensor = int8_tensor_type()
    first = weights[0]
    qdata = torch.cat([w.qdata for w in weights])
    scale = torch.cat([w.scale for w in weights])
    return Int8Tensor(qdata, scale, [1, qdata.shape[1]], first.dtype)


def int8_kernel_linear(x: Tensor, weight: Int8Weight, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` for an int8 ``weight`` on PyTorch's int8-weight kernel, with ``x`` rounded to bf16
    (the kernel's fast path; see the module's note). No gradient reaches ``x``: for rows that need no backward."""
    rows = x.numel() // x.shape[-1]
    y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, -1).to(torch.bfloat16), weight.qdata, _kernel_scale(weight))
    y = y.view(*x.shape[:-1], y.shape[-1]).float()
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def quantized_embedding(ids: Tensor, table: Int8Weight) -> Tensor:
    """The rows of ``ids`` of an int8 table, dequantized to f32: only those rows are read."""
    rows = torch.nn.functional.embedding(ids, table.qdata).float()
    return rows * torch.nn.functional.embedding(ids, table.scale)


def _kernel_scale(weight: Int8Weight) -> Tensor:
    """The per-row scales [out] as bf16 for the int8 kernel: exact, since they were chosen bf16-representable."""
    scale = getattr(weight, "_ster_kernel_scale", None)
    if scale is None:
        scale = weight.scale.reshape(-1).to(torch.bfloat16)
        weight._ster_kernel_scale = scale
    return scale
