"""What an intervention does and what it costs, teacher-forced and without sampling: one place for each measure.

Every measure runs one text as the rows of one forward, row ``r`` steered at its own scales (row 0 of a
ladder is usually strength 0, the unsteered model), so a whole ladder of strengths costs one batched
forward per text rather than one forward per strength; only the positions a measure reads reach the
vocabulary projection.

* **cost** (:func:`kl_cost`): KL(unsteered ‖ steered) of the next-token distribution, per prompt of a
  neutral set, at the first generated position (the measure heretic scores an abliteration by) and as
  the mean over the positions of a teacher-forced continuation: the unsteered model's own greedy
  continuation of the prompt (:func:`greedy_continuations`), up to ``k`` tokens, ended at an end-of-text
  token where the model chose one. In nats, summed over the vocabulary in f64.
* **behaviour** (:func:`behaviour`): on held-out pairs, log p(positive side) − log p(negative side), where a
  side is the tokens after the longest token prefix the pair's two encodings share (the shared prompt),
  each scored given that prompt and its own earlier tokens. Where the two encodings share no token, a
  side's first token has nothing to be predicted from, so each side is scored from its second token on.
  The mean over pairs, the share of pairs whose positive side is the likelier, and the mean of
  sigmoid(gap), the probability of the matching side between the two (the CAA paper's measure).
* **fluency** (:func:`perplexity`): the unsteered model's perplexity of a text given its prompt; the fluency
  ratio is that of the steered texts over that of the unsteered ones.

The arithmetic of the aggregates is in :mod:`ster.engine.steering.measured`, which imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ster.engine.model.llama import Decoder, Layout
from ster.engine.steering.activations import pack_rows, pair_row
from ster.engine.steering.apply import RowSteering

LOGIT_BYTES = 64 * 2**20
"""Most bytes of f32 logits one projection call holds (a 262,144-token vocabulary is 1 MiB a position)."""


def row_additions(model: Decoder, vectors: dict[int, list[float]], scales: list[dict[int, float]]) -> dict[int, Tensor]:
    """Per layer, [R, D]: row ``r`` is ``scales[r][layer] × vectors[layer]`` in the model's dtype and device."""
    weight = model.lm_head.weight
    layers = sorted(vectors)
    stacked = torch.tensor([vectors[layer] for layer in layers], dtype=torch.float32)  # [L, D]
    by_row = torch.tensor([[row.get(layer, 0.0) for layer in layers] for row in scales], dtype=torch.float32)  # [R, L]
    return {layer: (by_row[:, i, None] * stacked[i]).to(weight.device, weight.dtype) for i, layer in enumerate(layers)}


@dataclass(frozen=True)
class Rows:
    """A ladder of interventions: the rows one text runs as, each steered by its own additions."""

    additions: dict[int, Tensor]
    """Per layer [R, D]; empty for a single unsteered row."""
    count: int

    @staticmethod
    def of(model: Decoder, vectors: dict[int, list[float]], scales: list[dict[int, float]]) -> Rows:
        steered = any(any(row.values()) for row in scales)
        return Rows(row_additions(model, vectors, scales) if steered else {}, len(scales))


def _hidden(model: Decoder, ids: list[int], rows: Rows, layout: Layout | None = None) -> Tensor:
    """The residual stream [R, T, D] after the last block, ``ids`` run once per row under the row's additions."""
    device = model.lm_head.weight.device
    batch = torch.tensor([ids], device=device).expand(rows.count, -1)
    if layout is not None:
        layout = Layout(layout.positions.expand(rows.count, -1), layout.mask.expand(rows.count, -1, -1, -1))
    if not rows.additions:
        return model(batch, vocab="none", layout=layout).hidden
    with RowSteering(rows.additions).applied(model):
        return model(batch, vocab="none", layout=layout).hidden


def _log_probs(model: Decoder, hidden: Tensor, positions: list[int]) -> Callable[[], list[Tensor]]:
    """A thunk giving, per row, the log-softmax [P, V] (f32) of the next-token distributions at ``positions``."""
    index = torch.tensor(positions, device=hidden.device)

    def each() -> list[Tensor]:
        return [torch.log_softmax(model.project(hidden[r, index]), dim=-1) for r in range(hidden.shape[0])]

    return each


def greedy_continuations(model: Decoder, prompts: list[list[int]], tokens: int, eos_ids: frozenset[int],
                         *, batch_size: int = 16, check_cancelled: Callable[[], None] = lambda: None) -> list[list[int]]:
    """The unsteered model's greedy continuation of each prompt: ``tokens`` ids, or fewer when it chooses an
    end-of-text id (kept, as the last id). Prompts are decoded in left-padded batches over one KV cache."""
    device = model.lm_head.weight.device
    out: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            check_cancelled()
            chosen = order[start:start + batch_size]
            width = max(len(prompts[i]) for i in chosen)
            ids = torch.zeros(len(chosen), width, dtype=torch.long)
            key_mask = torch.zeros(len(chosen), width + tokens, dtype=torch.bool)
            for row, i in enumerate(chosen):
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                key_mask[row, width - len(prompts[i]):] = True
            key_mask = key_mask.to(device)
            cache = model.new_cache(len(chosen), width + tokens)
            logits = model(ids.to(device), cache=cache, key_mask=key_mask[:, :width]).logits
            ended = [False] * len(chosen)
            for step in range(tokens):
                picks = logits.argmax(dim=-1).tolist()
                for row, i in enumerate(chosen):
                    if not ended[row]:
                        out[i].append(picks[row])
                        ended[row] = picks[row] in eos_ids
                if all(ended) or step == tokens - 1:
                    break
                logits = model(torch.tensor(picks, device=device)[:, None], cache=cache,
                               key_mask=key_mask[:, :width + step + 1]).logits
    return out


@dataclass(frozen=True)
class PromptCost:
    first: list[float]
    """Per row, KL(row 0 ‖ row) at the first generated position."""
    mean: list[float]
    """Per row, the mean of that KL over the continuation's positions."""


def kl_cost(model: Decoder, prompt: list[int], continuation: list[int], rows: Rows,
            reference: list[Tensor] | None = None) -> PromptCost:
    """KL of each row's next-token distributions from row 0's (or from ``reference``, the unsteered
    log-probabilities [P, V] of the same positions, when given), teacher-forced on ``prompt`` + ``continuation``."""
    ids = prompt + continuation[:-1]
    positions = list(range(len(prompt) - 1, len(ids)))
    with torch.inference_mode():
        rows_lp = _log_probs(model, _hidden(model, ids, rows), positions)()
        base = reference[0] if reference is not None else rows_lp[0]
        base64 = base.double()
        p = base64.exp()
        first, mean = [], []
        for lp in rows_lp:
            kl = (p * (base64 - lp.double())).sum(-1).clamp(min=0.0)  # [P]; rounding can dip a hair below 0
            first.append(float(kl[0]))
            mean.append(float(kl.mean()))
    return PromptCost(first, mean)


def unsteered_log_probs(model: Decoder, prompt: list[int], continuation: list[int]) -> Tensor:
    """The unsteered model's log-probabilities [P, V] at the positions :func:`kl_cost` compares."""
    ids = prompt + continuation[:-1]
    with torch.inference_mode():
        return _log_probs(model, _hidden(model, ids, Rows({}, 1)), list(range(len(prompt) - 1, len(ids))))()[0]


def behaviour(model: Decoder, positive: list[int], negative: list[int], rows: Rows) -> list[float]:
    """Per row, log p(positive side) − log p(negative side) after the pair's shared prompt (see the module)."""
    row = pair_row(positive, negative)
    prefix = row.branch.count(0)
    own_pos = len(positive) - prefix
    predictors_pos = [prefix - 1 + j for j in range(own_pos)]
    predictors_neg = [prefix - 1] + [prefix + own_pos + j for j in range(len(negative) - prefix - 1)]
    targets = row.ids[prefix:]
    if prefix == 0:  # nothing predicts a side's first token: each side from its second token
        predictors_pos, predictors_neg = predictors_pos[1:], predictors_neg[1:]
        targets = row.ids[1:own_pos] + row.ids[own_pos + 1:]
    positions = predictors_pos + predictors_neg
    device = model.lm_head.weight.device
    _, layout = pack_rows([row], device)
    with torch.inference_mode():
        hidden = _hidden(model, row.ids, rows, layout)
        wanted = torch.tensor(targets, device=device)
        split = len(predictors_pos)
        gaps = []
        for lp in _log_probs(model, hidden, positions)():
            scored = lp.gather(-1, wanted[:, None])[:, 0].double()
            gaps.append(float(scored[:split].sum() - scored[split:].sum()))
    return gaps


def perplexity(model: Decoder, prompt: list[int], text: list[int]) -> float | None:
    """The unsteered model's perplexity of ``text`` given ``prompt`` (None for an empty text)."""
    if not text:
        return None
    ids = prompt + text
    with torch.inference_mode():
        lp = _log_probs(model, _hidden(model, ids, Rows({}, 1)), list(range(len(prompt) - 1, len(ids) - 1)))()[0]
        scored = lp.gather(-1, torch.tensor(text, device=lp.device)[:, None])[:, 0].double()
    return float(torch.exp(-scored.mean()))
