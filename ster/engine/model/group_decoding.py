"""Decoding several rows from one prompt as one batch: GRPO's group, a sweep's strengths.

The prompt is prefilled once and its keys and values are copied into every row of the
cache (``shared_prefill``), unless the rows differ already in the prompt — a sweep adds
a different steering vector to each row, prompt included — in which case the prompt is
prefilled as a batch of identical rows. Then every row steps together, one token each,
with its own seeded sampler; a row that reaches EOS or its token budget leaves the batch
(its cache rows are dropped), so it stops costing compute. ``select_rows`` is told the
original indices of the rows still running whenever the batch shrinks, so whoever adds
something per row (steering) can follow.

A row equals the same row decoded alone by :func:`~ster.engine.model.decoding.decode`
with the same :class:`Sampling`: the same prefill logits, the same sampler, the same
generator state per draw (tested; a batched matmul may round differently in the last
bit, which changes a draw only at a near tie).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ster.engine.model.contract import Decoder
from ster.engine.model.decoding import choose
from ster.engine.model.sampling import Generation, Sampling


def decode_group(
    model: Decoder,
    prompt_ids: list[int],
    samplings: list[Sampling],
    *,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    check_cancelled: Callable[[], None],
    on_token: Callable[[int, int, int], None] | None = None,
    shared_prefill: bool = True,
    select_rows: Callable[[torch.Tensor], None] | None = None,
) -> list[Generation]:
    """One generation per entry of ``samplings``, decoded together; ``on_token(row, index, id)`` per token."""
    device = model.lm_head.weight.device
    count = len(samplings)
    generators = [sampling.generator(device) for sampling in samplings]
    outputs: list[list[int]] = [[] for _ in samplings]
    results: list[Generation | None] = [None] * count
    active = list(range(count))
    length = len(prompt_ids) + max_new_tokens
    with torch.inference_mode():
        cache = model.new_cache(count, length)
        if shared_prefill:
            alone = model.new_cache(1, len(prompt_ids))
            logits = model(torch.tensor([prompt_ids], device=device), cache=alone).require_logits().expand(count, -1)
            cache.take_prefix(alone, count)
        else:
            logits = model(torch.tensor([prompt_ids] * count, device=device), cache=cache).require_logits()  # [B, V]
        while True:
            check_cancelled()
            tokens, keep = [], []
            for position, row in enumerate(active):
                token = choose(logits[position], samplings[row], generators[row])
                if token in eos_ids:
                    results[row] = Generation(outputs[row], "eos", token)
                    continue
                outputs[row].append(token)
                if on_token is not None:
                    on_token(row, len(outputs[row]) - 1, token)
                if len(outputs[row]) == max_new_tokens:
                    results[row] = Generation(outputs[row], "max_new_tokens")
                    continue
                tokens.append(token)
                keep.append(position)
            if not keep:
                return [result for result in results if result is not None]
            if len(keep) < len(active):
                cache.keep_rows(torch.tensor(keep, device=device))
                active = [active[position] for position in keep]
                if select_rows is not None:
                    select_rows(torch.tensor(active, device=device))
            ids = torch.tensor(tokens, device=device)[:, None]  # [B', 1]
            logits = model(ids, cache=cache).require_logits()
