"""Forward passes over training rows: right-padded batches, scored where a loss reads.

A batched forward right-pads its rows and masks every padded key out of every real
query (the decoder's ``key_mask``), so each row sees exactly what it would alone; a
batch of one row takes the plain causal path. Nothing here runs under
``inference_mode``: the training path records the autograd tape (the reference and
evaluation passes wrap it in ``no_grad`` themselves). The cache is never used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ster.engine.model.llama import Decoder


def forward_rows(decoder: Decoder, rows: list[list[int]], adapters: bool = True) -> Tensor:
    """Residual states [B, T, D] after the last block (before the final norm) of right-padded rows."""
    device = decoder.lm_head.weight.device
    longest = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, device=device)
    key_mask = None
    if any(len(row) != longest for row in rows):
        lengths = torch.tensor([len(row) for row in rows], device=device)
        key_mask = torch.arange(longest, device=device)[None, :] < lengths[:, None]  # [B, T]
    return decoder(ids, key_mask=key_mask, vocab="none", adapters=adapters).hidden


def token_logprobs(decoder: Decoder, hidden: Tensor, rows: list[list[int]], starts: list[int]) -> list[Tensor]:
    """Per row, the f32 log-probability of each token ``ids[start:]`` given what precedes it.

    Only the positions that predict those tokens go through the vocabulary projection.
    """
    device = hidden.device
    picks = [(i, torch.arange(start - 1, len(row) - 1, device=device)) for i, (row, start) in enumerate(zip(rows, starts))]
    states = torch.cat([hidden[i, positions] for i, positions in picks])  # [N, D]
    targets = torch.cat([torch.tensor(row[start:], device=device) for row, start in zip(rows, starts)])  # [N]
    logp = -F.cross_entropy(decoder.project(states), targets, reduction="none")  # [N] f32
    return list(logp.split([len(row) - start for row, start in zip(rows, starts)]))


def last_states(decoder: Decoder, hidden: Tensor, rows: list[list[int]]) -> Tensor:
    """The final-normed state [B, D] at each row's last real token: what a reward head reads."""
    last = torch.tensor([len(row) - 1 for row in rows], device=hidden.device)
    picked = hidden[torch.arange(len(rows), device=hidden.device), last]
    return decoder.final_norm(picked)


def pair_logprobs(decoder: Decoder, pairs: list[tuple[list[int], list[int]]],
                  adapters: bool = True) -> list[tuple[Tensor, Tensor]]:
    """Per pair, the f32 log-probabilities of its chosen and rejected side's tokens after the first.

    Each pair runs as one packed row (:func:`~ster.engine.steering.activations.pair_row`): the
    prefix both sides share once, then each side's own tokens, with positions and a mask that give
    each side exactly the view it would have alone. The prefix's log-probabilities are computed
    once and belong to both sides; equal to scoring the sides separately (tested to 1e-5).
    """
    from ster.engine.steering.activations import pack_rows, pair_row

    device = decoder.lm_head.weight.device
    rows = [pair_row(chosen, rejected) for chosen, rejected in pairs]
    ids, layout = pack_rows(rows, device)
    hidden = decoder(ids, vocab="none", layout=layout, adapters=adapters).hidden  # [B, T, D]
    picks, targets, sizes = [], [], []
    for i, ((chosen, rejected), row) in enumerate(zip(pairs, rows)):
        shared = _shared(row)
        own = len(rejected) - shared
        predictors = list(range(len(chosen) - 1)) + [shared - 1] + list(range(len(chosen), len(chosen) + own - 1))
        picks.append((i, torch.tensor(predictors, device=device)))
        targets.append(chosen[1:] + rejected[shared:])
        sizes.append((len(chosen) - 1, own, shared))
    states = torch.cat([hidden[i, positions] for i, positions in picks])  # [N, D]
    flat = torch.tensor([t for row_targets in targets for t in row_targets], device=device)
    logp = -F.cross_entropy(decoder.project(states), flat, reduction="none")  # [N] f32
    out = []
    for part, (chosen_n, own, shared) in zip(logp.split([c + o for c, o, _ in sizes]), sizes):
        chosen_logp = part[:chosen_n]
        out.append((chosen_logp, torch.cat([chosen_logp[:shared - 1], part[chosen_n:]])))
    return out


def _shared(row: object) -> int:
    """Tokens of a packed row's shared prefix (branch 0)."""
    return sum(1 for branch in row.branch if branch == 0)  # type: ignore[attr-defined]


def pair_last_states(decoder: Decoder, pairs: list[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor]:
    """The final-normed states [B, D] at the chosen and the rejected side's last tokens, one packed row per pair."""
    from ster.engine.steering.activations import pack_rows, pair_row

    device = decoder.lm_head.weight.device
    rows = [pair_row(chosen, rejected) for chosen, rejected in pairs]
    ids, layout = pack_rows(rows, device)
    hidden = decoder(ids, vocab="none", layout=layout).hidden
    picks = torch.arange(len(rows), device=device)
    ends = torch.tensor([row.ends for row in rows], device=device)  # [B, 2]
    return decoder.final_norm(hidden[picks, ends[:, 0]]), decoder.final_norm(hidden[picks, ends[:, 1]])
