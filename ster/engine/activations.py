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
from ster.engine.llama import Decoder, KVCache


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


def _pad(batch: list[list[int]], device: torch.device, allow_empty: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
    """Right-pad to the longest row: ids [B, T], key mask [B, T] (None when nothing is padded), last indices [B]."""
    lengths = torch.tensor([len(row) for row in batch])
    width = int(lengths.max())
    assert allow_empty or width > 0
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
    key_mask = torch.arange(width)[None, :] < lengths[:, None]
    padded = bool((lengths < width).any())
    return ids.to(device), key_mask.to(device) if padded else None, (lengths - 1).to(device)


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common leading ids, leaving each side at least one id of its own to read."""
    limit = min(len(a), len(b)) - 1
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def read_pair_states(
    model: Decoder,
    pairs: list[tuple[list[int], list[int]]],
    layers: list[int],
    *,
    batch_size: int,
    on_batch: Callable[[int, int], None] = lambda done, total: None,
    check_cancelled: Callable[[], None] = lambda: None,
) -> tuple[Tensor, Tensor]:
    """Last-token states [N, len(layers), D] of every positive and every negative side.

    The two sides of a pair usually share a long prefix (a system prompt, the question);
    it runs once, into a KV cache, and each side's own suffix runs after it. Reads equal
    :func:`read_last_states` on the whole sequences (tested to 1e-5).
    """
    device = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    prefixes = [shared_prefix(pos, neg) for pos, neg in pairs]
    order = sorted(range(len(pairs)), key=lambda i: (prefixes[i], max(map(len, pairs[i]))))
    positives = torch.empty(len(pairs), len(layers), model.config.hidden_size)
    negatives = torch.empty_like(positives)
    depth = max(layers) + 1
    with torch.inference_mode(), record_blocks(model, layers) as seen:
        for start in range(0, len(order), batch_size):
            check_cancelled()
            rows = order[start:start + batch_size]
            prefix_ids, prefix_mask, _ = _pad([pairs[i][0][: prefixes[i]] for i in rows], device, allow_empty=True)
            longest = max(len(side) - prefixes[i] for i in rows for side in pairs[i])
            cache = KVCache(model.config, len(rows), prefix_ids.shape[1] + longest, dtype, device)
            if prefix_ids.shape[1]:
                model(prefix_ids, cache=cache, key_mask=prefix_mask, depth=depth, vocab="none")
            for side, out in ((0, positives), (1, negatives)):
                cache.length = prefix_ids.shape[1]
                ids, mask, lasts = _pad([pairs[i][side][prefixes[i]:] for i in rows], device)
                key_mask = torch.cat([_full_mask(prefix_mask, prefix_ids), _full_mask(mask, ids)], dim=1)
                model(ids, cache=cache, key_mask=key_mask, depth=depth, vocab="none")
                picks = torch.arange(len(rows), device=device)
                for column, layer in enumerate(layers):
                    out[rows, column] = seen[layer][picks, lasts].float().cpu()
            on_batch(min(start + batch_size, len(order)), len(order))
    return positives, negatives


def _full_mask(mask: Tensor | None, ids: Tensor) -> Tensor:
    return mask if mask is not None else torch.ones_like(ids, dtype=torch.bool)
