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

from ster.engine.model.llama import Decoder, KVCache
from ster.engine.model.sampling import Generation, Sampling


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """Pick one token id from f32 ``logits`` [V]."""
    if generator is None:
        return int(logits.argmax())
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p is None or sampling.top_p >= 1:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = probs.sort(descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p  # mass before this token already reaches p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])


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
    dtype = model.lm_head.weight.dtype
    generator = sampling.generator(device)
    out: list[int] = []
    with torch.inference_mode():
        cache = KVCache(model.config, 1, len(prompt_ids) + max_new_tokens, dtype, device)
        logits = model(torch.tensor([prompt_ids], device=device), cache=cache).logits  # [1, V]
        while True:
            check_cancelled()
            token = choose(logits[0], sampling, generator)
            if token in eos_ids:
                return Generation(out, "eos", token)
            out.append(token)
            on_token(len(out) - 1, token)
            if len(out) == max_new_tokens:
                return Generation(out, "max_new_tokens")
            logits = model(torch.tensor([[token]], device=device), cache=cache).logits
