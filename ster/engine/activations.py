"""Reading the last token's residual state after selected blocks, in padded batches.

Sequences are sorted by length so a batch pads little, right-padded so every real
token keeps its unbatched position, and masked so no real query sees a padding key.
The forward stops after the deepest selected block and computes no vocabulary
projection. A batched read equals one-at-a-time reads (tested to 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ster.engine.hooks import record_blocks
from ster.engine.llama import Decoder


def read_last_states(
    model: Decoder,
    sequences: list[list[int]],
    layers: list[int],
    *,
    batch_size: int,
    on_batch: Callable[[int, int], None] = lambda done, total: None,
    check_cancelled: Callable[[], None] = lambda: None,
) -> Tensor:
    """States [N, len(layers), D] in f32 on the CPU, in the order of ``sequences``."""
    device = model.lm_head.weight.device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    states = torch.empty(len(sequences), len(layers), model.config.hidden_size)
    with torch.inference_mode(), record_blocks(model, layers) as seen:
        for start in range(0, len(order), batch_size):
            check_cancelled()
            rows = order[start:start + batch_size]
            ids, key_mask, lasts = _pad([sequences[i] for i in rows], device)
            model(ids, key_mask=key_mask, depth=max(layers) + 1, vocab="none")
            picks = torch.arange(len(rows), device=device)
            for column, layer in enumerate(layers):
                states[rows, column] = seen[layer][picks, lasts].float().cpu()
            on_batch(min(start + batch_size, len(order)), len(order))
    return states


def _pad(batch: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor | None, Tensor]:
    """Right-pad to the longest row: ids [B, T], key mask [B, T] (None when nothing is padded), last indices [B]."""
    lengths = torch.tensor([len(row) for row in batch])
    width = int(lengths.max())
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
    key_mask = torch.arange(width)[None, :] < lengths[:, None]
    padded = bool((lengths < width).any())
    return ids.to(device), key_mask.to(device) if padded else None, (lengths - 1).to(device)
