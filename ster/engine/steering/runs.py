"""The model runs behind ``generate`` and ``sweep``: decoding with a direction added, and re-reading texts.

These are the parts of the two jobs that need torch. The jobs import this module only
after every input is checked (files, model config and tokenizer, artifact, lengths), so
a bad input is refused in a fraction of a second rather than after torch's import.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from ster.engine.model.contract import Decoder
from ster.engine.model.decoding import decode
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.sampling import Generation, Sampling
from ster.engine.steering.activations import read_last_states
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import Plan


def steered_decode(
    model: Decoder,
    prompt_ids: list[int],
    plan: Plan,
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: frozenset[int],
    on_token: Callable[[int, int], None],
    check_cancelled: Callable[[], None],
) -> Generation:
    """Decode after ``prompt_ids`` with ``plan``'s edits at its sites; unsteered for an empty plan (so strength 0
    is the baseline exactly)."""
    edits = RowEdits.of(model, [plan])
    with edits.applied(model) if edits is not None else nullcontext():
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
    plans: list[Plan],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_ids: frozenset[int],
    on_token: Callable[[int, int, int], None],
    check_cancelled: Callable[[], None],
) -> list[Generation]:
    """One generation per plan (row ``i`` edited by ``plans[i]``: steered, ablated or clamped), decoded as one
    batch; a row with an empty plan is the unsteered baseline."""
    edits = RowEdits.of(model, plans)
    with edits.applied(model) if edits is not None else nullcontext():
        return decode_group(
            model,
            prompt_ids,
            [sampling] * len(plans),
            max_new_tokens=max_new_tokens,
            eos_ids=eos_ids,
            check_cancelled=check_cancelled,
            on_token=on_token,
            shared_prefill=edits is None,  # rows edited apart differ from the first edited site on
            select_rows=edits.select if edits is not None else None,
        )


def text_projections(model: Decoder, texts: list[list[int]], directions: dict[int, list[float]]) -> list[float]:
    """Each encoded text's last-token state, read without steering exactly as a pair side is read when a
    direction is fitted, projected onto the direction in f64; mean over the artifact's layers."""
    layers = sorted(directions)
    states = read_last_states(model, texts, layers, batch_size=8).double()  # [N, L, D]
    stacked = torch.tensor([directions[layer] for layer in layers], dtype=torch.float64)  # [L, D]
    return (states.cpu() * stacked).sum(-1).mean(-1).tolist()
