"""Autoregressive decoding with a preallocated KV cache: greedy, or seeded sampling.

One prefill forward computes only the last position's logits; each later step feeds
one token and reads one row of logits. The token id is read back every step
(``.item()``), which on a GPU is one sync per token: decoding needs it anyway to
stop at EOS and to stream text.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.model.sampling import Generation, Sampling


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """Pick one token id from f32 ``logits`` [V]: the argmax, or one seeded draw.

    A draw takes one uniform number from ``generator`` and inverts the cumulative distribution
    (not ``torch.multinomial``, which spends a random number per vocabulary entry). With top-p the
    nucleus is found among the most probable tokens first (``topk``, widened until it holds p of
    the mass) rather than by sorting the whole vocabulary: the same set, at a fraction of the cost.
    """
    if generator is None:
        return int(logits.argmax())
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p is None or sampling.top_p >= 1:
        return _draw(probs, generator)
    values, order = _nucleus(probs, sampling.top_p)
    return int(order[_draw(values, generator)])


def _nucleus(probs: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """The smallest set of most probable tokens whose mass reaches ``top_p``: probabilities (descending)
    and ids. A token is kept when the mass before it is still below p."""
    size = probs.shape[-1]
    k = min(64, size)
    while True:
        values, order = probs.topk(k)
        total = values.cumsum(-1)
        if total[-1] >= top_p or k == size:
            break
        k = min(k * 8, size)
    keep = int(((total - values) < top_p).sum())
    return values[:keep], order[:keep]


def _draw(probs: Tensor, generator: torch.Generator) -> int:
    """Index drawn with probability proportional to ``probs`` [N] (non-negative, not all zero)."""
    cumulative = probs.double().cumsum(-1)
    point = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device) * cumulative[-1]
    index = int(torch.searchsorted(cumulative, point.reshape(1), right=True))
    return min(index, probs.shape[-1] - 1)


def decode(
    model: Decoder,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: frozenset[int],
    on_token: Callable[[int, int], None],
    check_cancelled: Callable[[], None],
) -> Generation:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``, calling ``on_token(index, id)`` for each."""
    device = model.lm_head.weight.device
    generator = sampling.generator(device)
    out: list[int] = []
    with torch.inference_mode():
        cache = model.new_cache(1, len(prompt_ids) + max_new_tokens)
        logits = model(torch.tensor([prompt_ids], device=device), cache=cache).require_logits()  # [1, V]
        while True:
            check_cancelled()
            token = choose(logits[0], sampling, generator)
            if token in eos_ids:
                return Generation(out, "eos", token)
            out.append(token)
            on_token(len(out) - 1, token)
            if len(out) == max_new_tokens:
                return Generation(out, "max_new_tokens")
            logits = model(torch.tensor([[token]], device=device), cache=cache).require_logits()
