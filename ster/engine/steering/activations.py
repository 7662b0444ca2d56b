"""Reading the last token's residual state after selected blocks, in padded batches.

Sequences are sorted by length so a batch pads little, right-padded so every real
token keeps its unbatched position, and masked so no real query sees a padding key.
The forward stops after the deepest selected block and computes no vocabulary
projection. A batched read equals one-at-a-time reads (tested to 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder, Layout
from ster.engine.model.hooks import record_blocks


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
            rows = order[start : start + batch_size]
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


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common leading ids, leaving each side at least one id of its own to read."""
    limit = min(len(a), len(b)) - 1
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class Spread:
    """Running sums, per layer, of every position's state over the texts read, for the RMS spread of the states
    about their mean: sqrt(E‖h‖² − ‖E h‖²). Each text's first position is left out: that is where massive
    activations sit in many models (a beginning-of-text token's state can be hundreds of times the others'),
    and a constant offset that every position carries cancels in the spread, so neither inflates it."""

    def __init__(self, layers: list[int], width: int) -> None:
        self.layers = layers
        self.count = 0
        self.total = torch.zeros(len(layers), width, dtype=torch.float64)
        self.squares = torch.zeros(len(layers), dtype=torch.float64)

    def add(self, seen: dict[int, Tensor], real: Tensor) -> None:
        """Add the states [B, T, D] at the ``real`` [B, T] positions of each layer."""
        self.count += int(real.sum())
        for column, layer in enumerate(self.layers):
            states = seen[layer][real].double().cpu()  # [N, D]
            self.total[column] += states.sum(0)
            self.squares[column] += (states * states).sum()

    def values(self) -> dict[int, float | None]:
        if not self.count:
            return {layer: None for layer in self.layers}
        mean = self.total / self.count
        variance = (self.squares / self.count - (mean * mean).sum(-1)).clamp(min=0.0)
        return {layer: float(value) ** 0.5 for layer, value in zip(self.layers, variance.tolist())}


def read_pair_states(
    model: Decoder,
    pairs: list[tuple[list[int], list[int]]],
    layers: list[int],
    *,
    batch_size: int,
    on_batch: Callable[[int, int], None] = lambda done, total: None,
    check_cancelled: Callable[[], None] = lambda: None,
    spread: Spread | None = None,
) -> tuple[Tensor, Tensor]:
    """Last-token states [N, len(layers), D] of every positive and every negative side.

    The two sides of a pair usually share a long prefix (a system prompt, the question).
    Each pair runs as one packed row — the prefix once, then both sides' own tokens —
    with positions and a mask that give each side exactly the view it would have alone,
    so no token is computed twice. Rows are sorted by length so a batch pads little.
    Reads equal :func:`read_last_states` on the whole sequences (tested to 1e-5). With ``spread``, every
    position's state also goes into its sums.
    """
    device = model.lm_head.weight.device
    rows = [pair_row(pos, neg) for pos, neg in pairs]
    order = sorted(range(len(pairs)), key=lambda i: len(rows[i].ids))
    positives = torch.empty(len(pairs), len(layers), model.config.hidden_size)
    negatives = torch.empty_like(positives)
    with torch.inference_mode(), record_blocks(model, layers) as seen:
        for start in range(0, len(order), batch_size):
            check_cancelled()
            chosen = order[start : start + batch_size]
            ids, layout = pack_rows([rows[i] for i in chosen], device)
            model(ids, depth=max(layers) + 1, vocab="none", layout=layout)
            picks = torch.arange(len(chosen), device=device)
            ends = torch.tensor([rows[i].ends for i in chosen], device=device)  # [B, 2]
            for column, layer in enumerate(layers):
                positives[chosen, column] = seen[layer][picks, ends[:, 0]].float().cpu()
                negatives[chosen, column] = seen[layer][picks, ends[:, 1]].float().cpu()
            if spread is not None:
                real = torch.zeros(ids.shape, dtype=torch.bool, device=device)
                for i, row in enumerate(chosen):
                    real[i, 1 : len(rows[row].ids)] = True  # every real token but the first (see Spread)
                spread.add(seen, real)
            on_batch(min(start + batch_size, len(order)), len(order))
    return positives, negatives


@dataclass(frozen=True)
class PairRow:
    ids: list[int]
    """The shared prefix, then the positive's own tokens, then the negative's."""
    positions: list[int]
    branch: list[int]
    """0 for the shared prefix, 1 for the positive's tokens, 2 for the negative's."""
    ends: tuple[int, int]
    """Row indices of the positive's and the negative's last token."""


def pair_row(pos: list[int], neg: list[int]) -> PairRow:
    shared = shared_prefix(pos, neg)
    own_pos, own_neg = pos[shared:], neg[shared:]
    ids = pos[:shared] + own_pos + own_neg
    positions = list(range(len(pos))) + list(range(shared, len(neg)))
    branch = [0] * shared + [1] * len(own_pos) + [2] * len(own_neg)
    return PairRow(ids, positions, branch, (len(pos) - 1, len(ids) - 1))


def pack_rows(rows: list[PairRow], device: torch.device) -> tuple[Tensor, Layout]:
    """Pad packed rows to one width and build their positions and tree-shaped mask."""
    width = max(len(row.ids) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    branch = torch.full((len(rows), width), -1)
    for i, row in enumerate(rows):
        n = len(row.ids)
        ids[i, :n], positions[i, :n], branch[i, :n] = (
            torch.tensor(row.ids),
            torch.tensor(row.positions),
            torch.tensor(row.branch),
        )
    query_branch, key_branch = branch[:, :, None], branch[:, None, :]
    visible = (key_branch == 0) | (key_branch == query_branch)
    causal = positions[:, None, :] <= positions[:, :, None]
    mask = visible & causal & (key_branch >= 0)
    mask |= torch.eye(width, dtype=torch.bool)  # a padding query sees itself rather than nothing
    return ids.to(device), Layout(positions.to(device), mask[:, None].to(device))
