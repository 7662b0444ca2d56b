"""Forward passes over training rows: right-padded batches or prefix trees, scored where a loss reads.

A batched forward right-pads its rows and masks every padded key out of every real
query (the decoder's ``key_mask``), so each row sees exactly what it would alone; a
batch of one row takes the plain causal path. The training objectives instead pack the
rows of a forward into one row along their shared prefixes (:func:`pack_tree`): a
pair's prompt, and the system turn a chat template puts before every example, are
computed once per forward, and :func:`fuse` joins a step's consecutive forwards while
the packed row stays within :data:`PACK_TOKENS`. Nothing here runs under
``inference_mode``: the training path records the autograd tape (the reference and
evaluation passes wrap it in ``no_grad`` themselves). The cache is never used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ster.engine.model.contract import Decoder, Layout

T = TypeVar("T")

PACK_TOKENS = 160
"""The most tokens a forward joined from several of a step's forwards may pack (one alone may be
longer): on SmolLM2 at f32 its peak memory stays under TRL's batch-1 step (bench/tune_speed.py)."""


def forward_rows(decoder: Decoder, rows: list[list[int]], adapters: bool = True) -> Tensor:
    """Residual states [B, T, D] after the last block (before the final norm) of right-padded rows."""
    device = decoder.lm_head.weight.device
    longest = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, device=device)
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
    picks = [
        (i, torch.arange(start - 1, len(row) - 1, device=device)) for i, (row, start) in enumerate(zip(rows, starts))
    ]
    states = torch.cat([hidden[i, positions] for i, positions in picks])  # [N, D]
    targets = torch.cat([torch.tensor(row[start:], device=device) for row, start in zip(rows, starts)])  # [N]
    logp = -F.cross_entropy(decoder.project(states), targets, reduction="none")  # [N] f32
    return list(logp.split([len(row) - start for row, start in zip(rows, starts)]))


@dataclass(frozen=True)
class Tree:
    """Rows merged along their shared prefixes into one row: every distinct prefix appears once."""

    ids: Tensor
    """[1, N] the token of every node, each after its parent."""
    layout: Layout | None
    """Each node's position (its depth in the tree) and a mask letting it see exactly itself and its
    ancestors; None for a single row, which takes the plain causal path."""
    nodes: list[list[int]]
    """Per input row, the node of each of its tokens."""


def _trie(rows: list[list[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """Each node's token and depth in the prefix tree of ``rows`` (in insertion order), and each row's nodes."""
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    nodes = []
    for row in rows:
        parent, path = -1, []
        for position, token in enumerate(row):
            node = index.get((parent, token))
            if node is None:
                node = index[(parent, token)] = len(tokens)
                tokens.append(token)
                depth.append(position)
            path.append(node)
            parent = node
        nodes.append(path)
    return tokens, depth, nodes


def tree_width(rows: list[list[int]]) -> int:
    """How many tokens ``rows`` take packed along their shared prefixes."""
    return len(_trie(rows)[0])


def pack_tree(rows: list[list[int]], device: torch.device) -> Tree:
    """The prefix tree of ``rows`` flattened into one row. Every token sees itself and the tokens before
    it in its own rows, at the position it has there, so each row's states equal an unpacked forward's."""
    tokens, depth, nodes = _trie(rows)
    ids = torch.tensor([tokens], device=device)
    if len(rows) == 1:
        return Tree(ids, None, nodes)
    mask = torch.zeros(len(tokens), len(tokens), dtype=torch.bool)
    for path in nodes:
        at = torch.tensor(path)
        mask[at[:, None], at[None, :]] |= torch.ones(len(path), len(path), dtype=torch.bool).tril()
    return Tree(ids, Layout(torch.tensor([depth], device=device), mask[None, None].to(device)), nodes)


def forward_tree(decoder: Decoder, rows: list[list[int]], adapters: bool = True) -> tuple[Tensor, Tree]:
    """Residual states [1, N, D] of ``rows`` packed along their shared prefixes, and the packing."""
    tree = pack_tree(rows, decoder.lm_head.weight.device)
    return decoder(tree.ids, vocab="none", layout=tree.layout, adapters=adapters).hidden, tree


def tree_logprobs(
    decoder: Decoder, hidden: Tensor, tree: Tree, rows: list[list[int]], starts: list[int]
) -> list[Tensor]:
    """Per row, the f32 log-probability of each token ``row[start:]`` given what precedes it. A state
    and next token that several rows share (their common prefix) go through the vocabulary projection once."""
    unique: dict[tuple[int, int], int] = {}
    picks = [
        [unique.setdefault((path[t - 1], row[t]), len(unique)) for t in range(start, len(row))]
        for path, row, start in zip(tree.nodes, rows, starts)
    ]
    device = hidden.device
    states = hidden[0, torch.tensor([node for node, _ in unique], device=device)]  # [U, D]
    targets = torch.tensor([token for _, token in unique], device=device)
    logp = -F.cross_entropy(decoder.project(states), targets, reduction="none")  # [U] f32
    return [logp[torch.tensor(row_picks, device=device)] for row_picks in picks]


def tree_last_states(decoder: Decoder, hidden: Tensor, tree: Tree) -> Tensor:
    """The final-normed state [R, D] at each packed row's last token: what a reward head reads."""
    return decoder.final_norm(hidden[0, torch.tensor([path[-1] for path in tree.nodes], device=hidden.device)])


def fuse(items: list[T], rows_of: Callable[[T], list[list[int]]], budget: int | None = None) -> list[list[T]]:
    """Consecutive ``items`` (a step's forwards) joined while their rows, packed along shared prefixes, fit
    in ``budget`` tokens (default :data:`PACK_TOKENS`, read at each call; 0 joins nothing); an item that
    alone is wider stays alone."""
    budget = PACK_TOKENS if budget is None else budget
    groups: list[list[T]] = []
    rows: list[list[int]] = []
    for item in items:
        own = rows_of(item)
        if groups and tree_width(rows + own) <= budget:
            groups[-1].append(item)
            rows = rows + own
        else:
            groups.append([item])
            rows = own
    return groups
