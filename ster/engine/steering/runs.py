"""The model runs behind ``generate`` and ``sweep``: decoding with a direction added, and re-reading texts.

These are the parts of the two jobs that need torch. The jobs import this module only
after every input is checked (files, model config and tokenizer, artifact, lengths), so
a bad input is refused in a fraction of a second rather than after torch's import.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from ster.engine.model.contract import Decoder
from ster.engine.model.decoding import decode
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.sampling import Generation, Sampling
from ster.engine.steering.activations import read_last_states
from ster.engine.steering.apply import RowSteering, plan, steer
from ster.engine.steering.measures import row_additions


def steered_decode(
    model: Decoder,
    prompt_ids: list[int],
    vectors: dict[int, list[float]] | None,
    scales: dict[int, float] | None,
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: frozenset[int],
    on_token: Callable[[int, int], None],
    check_cancelled: Callable[[], None],
) -> Generation:
    """Decode after ``prompt_ids`` with ``scales[layer] × vectors[layer]`` added after each listed block;
    unsteered when either is None or every scale is 0 (so strength 0 is the baseline exactly)."""
    steering: AbstractContextManager[None] = nullcontext()
    if vectors is not None and scales is not None and any(scales.values()):
        steering = steer(model, plan(model, vectors, scales))
    with steering:
        return decode(
            model,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_ids=eos_ids,
            on_token=on_token,
            check_cancelled=check_cancelled,
        )


def steered_rows_decode(
    model: Decoder,
    prompt_ids: list[int],
    vectors: dict[int, list[float]],
    scales: list[dict[int, float]],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: frozenset[int],
    on_token: Callable[[int, int, int], None],
    check_cancelled: Callable[[], None],
) -> list[Generation]:
    """One generation per entry of ``scales`` (row ``i`` steered at ``scales[i][layer] × vectors[layer]``),
    decoded as one batch; a row whose scales are all 0 is the unsteered baseline."""
    steering = None
    if any(any(row.values()) for row in scales):  # each [B, D], scaled as plan() scales
        steering = RowSteering(row_additions(model, vectors, scales))
    with steering.applied(model) if steering is not None else nullcontext():
        return decode_group(
            model,
            prompt_ids,
            [sampling] * len(scales),
            max_new_tokens=max_new_tokens,
            eos_ids=eos_ids,
            check_cancelled=check_cancelled,
            on_token=on_token,
            shared_prefill=steering is None,  # rows steered apart differ from the first block on
            select_rows=steering.select if steering is not None else None,
        )


def text_projections(model: Decoder, texts: list[list[int]], directions: dict[int, list[float]]) -> list[float]:
    """Each encoded text's last-token state, read without steering exactly as a pair side is read when a
    direction is fitted, projected onto the direction in f64; mean over the artifact's layers."""
    layers = sorted(directions)
    states = read_last_states(model, texts, layers, batch_size=8).double()  # [N, L, D]
    stacked = torch.tensor([directions[layer] for layer in layers], dtype=torch.float64)  # [L, D]
    return (states.cpu() * stacked).sum(-1).mean(-1).tolist()
