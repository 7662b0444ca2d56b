"""What an intervention does and what it costs, teacher-forced and without sampling: one place for each measure.

Every measure runs its texts as the rows of one forward, row ``r`` steered at its own scales (row 0 of a
ladder is strength 0, the unsteered model), so a whole ladder of strengths costs one batched forward
rather than one forward per strength. Several texts go into one packed row (:class:`Tree`): the prefix
they all share (a chat template's system turn) once, then each text's own tokens, each seeing exactly what
it would see alone. The blocks before the first steered one run once, on one row. Only the positions a
measure reads reach the vocabulary projection, a slice of positions at a time.

* **cost** (:func:`kl_costs`): KL(unsteered ‖ steered) of the next-token distribution, per prompt of a
  neutral set, at the first generated position (the measure heretic scores an abliteration by) and as
  the mean over the positions of a teacher-forced continuation: the unsteered model's own greedy
  continuation of the prompt (:func:`greedy_continuations`), up to ``k`` tokens, ended at an end-of-text
  token where the model chose one. In nats, summed over the vocabulary in f64.
* **behaviour** (:func:`behaviours`): on held-out pairs, log p(positive side) − log p(negative side), where a
  side is the tokens after the longest token prefix the pair's two encodings share (the shared prompt),
  each scored given that prompt and its own earlier tokens. Where the two encodings share no token, a
  side's first token has nothing to be predicted from, so each side is scored from its second token on.
  The mean over pairs, the share of pairs whose positive side is the likelier, and the mean of
  sigmoid(gap), the probability of the matching side between the two (the CAA paper's measure).
* **fluency** (:func:`perplexity`): the unsteered model's perplexity of a text given its prompt; the fluency
  ratio is that of the steered texts over that of the unsteered ones.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder, Layout
from ster.engine.steering.activations import shared_prefix
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import Plan

LOGIT_BYTES = 64 * 2**20
"""Most bytes of f32 logits one projection call holds (a 262,144-token vocabulary is 1 MiB a position)."""


@dataclass(frozen=True)
class Rows:
    """A ladder of interventions: the rows every text runs as, each edited by its own plan."""

    edits: RowEdits | None
    """Every row's edits; None when no row edits anything."""
    count: int

    @staticmethod
    def of(model: Decoder, plans: list[Plan]) -> Rows:
        return Rows(RowEdits.of(model, plans), len(plans))

    @staticmethod
    def unsteered(count: int = 1) -> Rows:
        return Rows(None, count)


PACK_TOKENS = 768
"""Most tokens in one packed row: attention over a packed row grows as its square."""


class Tree:
    """Items packed into one row: the prefix every sequence shares, then per item the part its sequences share
    (a pair's prompt; all of a lone text), then each sequence's own tokens. A token sees the earlier tokens of
    its own part and all of its ancestors' parts, at the positions it would have alone."""

    def __init__(self, items: list[list[list[int]]]) -> None:
        sequences = [seq for item in items for seq in item]
        common = min(len(seq) for seq in sequences) - 1
        for seq in sequences[1:]:
            common = min(common, shared_prefix(sequences[0], seq))
        self.common = max(common, 0)
        ids, positions, nodes, parents = (
            list(sequences[0][: self.common]),
            list(range(self.common)),
            [0] * self.common,
            [-1],
        )
        self.starts: list[
            tuple[int, int, list[int]]
        ] = []  # per item: (its shared length, row index of it, per sequence own row index)
        for item in items:
            shared = len(item[0]) if len(item) == 1 else min(shared_prefix(item[0], seq) for seq in item[1:])
            shared = max(shared, self.common)
            node = len(parents)
            parents.append(0)
            at = len(ids)
            ids += item[0][self.common : shared]
            positions += list(range(self.common, shared))
            nodes += [node] * (shared - self.common)
            own = []
            for seq in item if len(item) > 1 else []:
                own.append(len(ids))
                leaf = len(parents)
                parents.append(node)
                ids += seq[shared:]
                positions += list(range(shared, len(seq)))
                nodes += [leaf] * (len(seq) - shared)
            self.starts.append((shared, at, own))
        self.ids, self.positions, self.nodes, self.parents = ids, positions, nodes, parents

    def index(self, item: int, sequence: int, position: int) -> int:
        """Row index of the token at ``position`` of ``sequence`` of ``item``."""
        if position < self.common:
            return position
        shared, at, own = self.starts[item]
        if position < shared:
            return at + position - self.common
        return own[sequence] + position - shared

    def layout(self, device: torch.device) -> Layout:
        count = len(self.parents)
        ancestor = torch.eye(count, dtype=torch.bool)
        for node in range(count):  # parents come before their children
            parent = self.parents[node]
            if parent >= 0:
                ancestor[node] |= ancestor[parent]
        nodes = torch.tensor(self.nodes)
        width = len(self.ids)
        order = torch.arange(width)
        mask = ancestor[nodes][:, nodes] & (order[None, :] <= order[:, None])  # [T, T]: query row, key column
        return Layout(torch.tensor([self.positions], device=device), mask[None, None].to(device))


def packed(items: list[list[list[int]]]) -> list[list[int]]:
    """Item indices in groups of at most ``PACK_TOKENS`` tokens (an item longer than that is a group alone)."""
    groups: list[list[int]] = [[]] if items else []
    size = 0
    for index, item in enumerate(items):
        tokens = sum(len(seq) for seq in item)
        if groups[-1] and size + tokens > PACK_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(index)
        size += tokens
    return groups


def _hidden(model: Decoder, tree: Tree, rows: Rows) -> Tensor:
    """The residual stream [R, T, D] after the last block, the packed row run once per row under its additions.

    The blocks before the first steered one see the same stream in every row, so they run once, on one row,
    and the rows part from there (on Ster's own decoder; transformers' model runs them again)."""
    device = model.lm_head.weight.device
    layout = tree.layout(device)
    one = torch.tensor([tree.ids], device=device)
    if rows.edits is None:
        return model(one, vocab="none", layout=layout).hidden.expand(rows.count, -1, -1)
    wide = Layout(layout.positions.expand(rows.count, -1), layout.mask.expand(rows.count, -1, -1, -1))
    first = rows.edits.first  # the embedding's site (-1) edits the first block's input: nothing shared
    start = None
    if first > 0:
        shared = model(one, vocab="none", depth=first, layout=layout).hidden
        start = (first, shared.expand(rows.count, -1, -1))
    with rows.edits.applied(model):
        return model(one.expand(rows.count, -1), vocab="none", layout=wide, start=start).hidden


def _slices(model: Decoder, positions: list[int]) -> list[list[int]]:
    step = max(1, LOGIT_BYTES // (4 * model.config.vocab_size))
    return [positions[i : i + step] for i in range(0, len(positions), step)]


def greedy_continuations(
    model: Decoder,
    prompts: list[list[int]],
    tokens: int,
    eos_ids: frozenset[int],
    *,
    batch_size: int = 16,
    check_cancelled: Callable[[], None] = lambda: None,
    plans: list[Plan] | None = None,
    settled: Callable[[list[int]], bool] | None = None,
) -> list[list[int]]:
    """The greedy continuation of each prompt, unsteered or (with ``plans``, one per prompt) edited by its own
    plan: ``tokens`` ids, or fewer when it chooses an end-of-text id (kept, as the last id), or when
    ``settled`` says of its ids so far that no later token can change what they are read for (a refusal
    judge's marker has been said). Prompts are decoded in left-padded batches over one KV cache, each row under
    its own edits; a row that ends leaves the batch (its cache rows and edits are dropped), so it stops costing
    compute."""
    device = model.lm_head.weight.device
    out: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            check_cancelled()
            chosen = order[start : start + batch_size]
            edits = RowEdits.of(model, [plans[i] for i in chosen]) if plans is not None else None
            kinds = [id(plans[i]) for i in chosen] if plans is not None else [0] * len(chosen)
            with edits.applied(model) if edits is not None else nullcontext():
                _greedy_batch(model, prompts, chosen, kinds, tokens, eos_ids, out, device, edits, settled)
    return out


def _greedy_batch(
    model: Decoder,
    prompts: list[list[int]],
    chosen: list[int],
    kinds: list[int],
    tokens: int,
    eos_ids: frozenset[int],
    out: list[list[int]],
    device: torch.device,
    edits: RowEdits | None,
    settled: Callable[[list[int]], bool] | None,
) -> None:
    """One batch of :func:`greedy_continuations`, its ids appended to ``out``.

    The ids every prompt of the batch begins with (a chat template's system turn) are prefilled once per kind
    of row (rows of one kind are edited alike, ``kinds`` telling them apart) and their keys and values copied
    into each row of that kind; then each prompt's own ids, left-padded up to that prefix (the padding is
    masked, and positions count real tokens only); then one token a step."""
    if tokens < 1:
        return
    common = min(len(prompts[i]) for i in chosen) - 1
    for i in chosen[1:]:
        common = min(common, shared_prefix(prompts[chosen[0]], prompts[i]))
    firsts = {kind: row for row, kind in reversed(list(enumerate(kinds)))}
    if len(firsts) == len(chosen):
        common = 0  # every row edited apart: nothing to share
    own = max(len(prompts[i]) for i in chosen) - common
    width = common + own
    ids = torch.zeros(len(chosen), own, dtype=torch.long)
    key_mask = torch.zeros(len(chosen), width + tokens, dtype=torch.bool)
    key_mask[:, :common] = True
    key_mask[:, width:] = True  # the answer's own tokens
    for row, i in enumerate(chosen):
        tail = prompts[i][common:]
        ids[row, own - len(tail) :] = torch.tensor(tail)
        key_mask[row, width - len(tail) : width] = True
    key_mask = key_mask.to(device)
    if common:
        leaders = list(firsts.values())
        cache = model.new_cache(len(leaders), width + tokens)
        if edits is not None:
            edits.select(torch.tensor(leaders, device=device))
        model(torch.tensor([prompts[chosen[0]][:common]] * len(leaders), device=device), cache=cache, vocab="none")
        place = {kind: n for n, kind in enumerate(firsts)}
        cache.keep_rows(torch.tensor([place[kind] for kind in kinds], device=device))
        if edits is not None:
            edits.select(torch.arange(len(chosen), device=device))
    else:
        cache = model.new_cache(len(chosen), width + tokens)
    logits = model(ids.to(device), cache=cache, key_mask=key_mask[:, :width]).require_logits()
    active = list(range(len(chosen)))
    """The batch's rows still decoding, by their place in ``chosen``."""
    for step in range(tokens - 1):
        picks = logits.argmax(dim=-1).tolist()
        keep = []
        for position, row in enumerate(active):
            answer = out[chosen[row]]
            answer.append(picks[position])
            if picks[position] not in eos_ids and (settled is None or not settled(answer)):
                keep.append(position)
        if not keep:
            return
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.keep_rows(index)
            key_mask = key_mask.index_select(0, index)
            active = [active[position] for position in keep]
            if edits is not None:
                edits.select(torch.tensor(active, device=device))
        logits = model(
            torch.tensor([picks[position] for position in keep], device=device)[:, None],
            cache=cache,
            key_mask=key_mask[:, : width + step + 1],
        ).require_logits()
    picks = logits.argmax(dim=-1).tolist()
    for position, row in enumerate(active):
        out[chosen[row]].append(picks[position])


@dataclass(frozen=True)
class PromptCost:
    first: list[float]
    """Per row, KL(row 0 ‖ row) at the first generated position."""
    mean: list[float]
    """Per row, the mean of that KL over the continuation's positions."""


def kl_costs(
    model: Decoder,
    items: list[tuple[list[int], list[int]]],
    rows: Rows,
    check_cancelled: Callable[[], None] = lambda: None,
) -> list[PromptCost]:
    """Per (prompt, continuation), the KL of each row's next-token distributions from row 0's, teacher-forced
    on the prompt and the continuation, at every position that predicts a continuation token."""
    costs: list[PromptCost] = []
    for group in packed([[prompt + continuation[:-1]] for prompt, continuation in items]):
        check_cancelled()
        chosen = [items[i] for i in group]
        tree = Tree([[prompt + continuation[:-1]] for prompt, continuation in chosen])
        spans = [
            [tree.index(k, 0, p) for p in range(len(prompt) - 1, len(prompt) + len(continuation) - 1)]
            for k, (prompt, continuation) in enumerate(chosen)
        ]
        positions = [p for span in spans for p in span]
        with torch.inference_mode():
            hidden = _hidden(model, tree, rows)
            kl = torch.empty(rows.count, len(positions), dtype=torch.float64)
            done = 0
            for piece in _slices(model, positions):
                index = torch.tensor(piece, device=hidden.device)
                base = torch.log_softmax(model.project(hidden[0, index]), dim=-1)
                p = base.exp()
                kl[0, done : done + len(piece)] = 0.0
                for r in range(1, rows.count):
                    lp = torch.log_softmax(model.project(hidden[r, index]), dim=-1)
                    # Σ p (log p − log q) as p·log p − p·log q, two f32 dot products a position summed in f64
                    # (f32 over a 262,144-token vocabulary is within 1e-6 of f64 here, at a quarter of the traffic)
                    kl[r, done : done + len(piece)] = ((p * base).sum(-1).double() - (p * lp).sum(-1).double()).clamp(
                        min=0.0
                    )
                done += len(piece)
        at = 0
        for span in spans:
            part = kl[:, at : at + len(span)]
            costs.append(PromptCost(part[:, 0].tolist(), part.mean(-1).tolist()))
            at += len(span)
    return costs


def kl_cost(model: Decoder, prompt: list[int], continuation: list[int], rows: Rows) -> PromptCost:
    """:func:`kl_costs` of one prompt."""
    return kl_costs(model, [(prompt, continuation)], rows)[0]


def _scored(model: Decoder, hidden: Tensor, positions: list[int], targets: list[int]) -> Tensor:
    """Per row, log p(target) [R, P] at each position, the vocabulary projected a slice at a time."""
    out = torch.empty(hidden.shape[0], len(positions), dtype=torch.float64)
    done = 0
    for piece in _slices(model, positions):
        index = torch.tensor(piece, device=hidden.device)
        wanted = torch.tensor(targets[done : done + len(piece)], device=hidden.device)
        for r in range(hidden.shape[0]):
            logits = model.project(hidden[r, index])
            picked = logits.gather(-1, wanted[:, None])[:, 0]
            out[r, done : done + len(piece)] = (picked - torch.logsumexp(logits, dim=-1)).double()
        done += len(piece)
    return out


def behaviours(
    model: Decoder,
    pairs: list[tuple[list[int], list[int]]],
    rows: Rows,
    check_cancelled: Callable[[], None] = lambda: None,
) -> list[list[float]]:
    """Per pair, per row, log p(positive side) − log p(negative side) after the pair's shared prompt."""
    gaps: list[list[float]] = []
    for group in packed([[pos, neg] for pos, neg in pairs]):
        check_cancelled()
        chosen = [pairs[i] for i in group]
        tree = Tree([[pos, neg] for pos, neg in chosen])
        positions, targets, sides = [], [], []
        for k, (pos, neg) in enumerate(chosen):
            shared = shared_prefix(pos, neg)
            for s, seq in enumerate((pos, neg)):
                begin = max(shared, 1)  # with no shared prompt nothing predicts a side's first token
                positions += [tree.index(k, s, p - 1) for p in range(begin, len(seq))]
                targets += seq[begin:]
                sides.append(len(seq) - begin)
        with torch.inference_mode():
            scored = _scored(model, _hidden(model, tree, rows), positions, targets)
        at = 0
        for k in range(len(chosen)):
            pos_part = scored[:, at : at + sides[2 * k]].sum(-1)
            at += sides[2 * k]
            neg_part = scored[:, at : at + sides[2 * k + 1]].sum(-1)
            at += sides[2 * k + 1]
            gaps.append((pos_part - neg_part).tolist())
    return gaps


def behaviour(model: Decoder, positive: list[int], negative: list[int], rows: Rows) -> list[float]:
    """:func:`behaviours` of one pair."""
    return behaviours(model, [(positive, negative)], rows)[0]


def perplexity(model: Decoder, prompt: list[int], text: list[int]) -> float | None:
    """The unsteered model's perplexity of ``text`` given ``prompt`` (None for an empty text)."""
    if not text:
        return None
    ids = prompt + text
    tree = Tree([[ids]])
    with torch.inference_mode():
        scored = _scored(
            model, _hidden(model, tree, Rows.unsteered()), list(range(len(prompt) - 1, len(ids) - 1)), text
        )
    return float(torch.exp(-scored[0].mean()))
