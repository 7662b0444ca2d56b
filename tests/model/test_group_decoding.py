"""Batched sampling: every row of a group decoded together equals the same row decoded alone."""

from __future__ import annotations

import pytest
import torch

from ster.engine.model.decoding import decode
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.loading import model_store
from ster.engine.model.sampling import Sampling
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.intervention import added
from ster.engine.steering.requests import GenerateRequest
from ster.engine.steering.runs import steered_decode, steered_rows_decode


def _toy(prompt: str = "the sea is"):
    ctx = JobContext(lambda event: None)
    request = GenerateRequest(model="ster:toy", prompt=prompt)
    checkpoint = model_store(ctx).open(request, ctx)
    return model_store(ctx).decoder(checkpoint, ctx), checkpoint.codec


def _alone(model, prompt, sampling, eos, n):
    return decode(
        model,
        prompt,
        max_new_tokens=n,
        sampling=sampling,
        eos_ids=eos,
        on_token=lambda i, t: None,
        check_cancelled=lambda: None,
    )


@pytest.mark.parametrize("top_p", [None, 0.9])
def test_each_sampled_row_equals_the_row_decoded_alone(top_p) -> None:
    model, codec = _toy()
    prompt = codec.encode_prompt("the sea is")
    samplings = [Sampling(temperature=1.0, top_p=top_p, seed=7 + i) for i in range(6)]
    seen: list[tuple[int, int, int]] = []
    rows = decode_group(
        model,
        prompt,
        samplings,
        max_new_tokens=20,
        eos_ids=codec.eos_ids,
        check_cancelled=lambda: None,
        on_token=lambda r, i, t: seen.append((r, i, t)),
    )
    alone = [_alone(model, prompt, s, codec.eos_ids, 20) for s in samplings]
    assert rows == alone
    assert len({tuple(g.ids) for g in rows}) > 1, "different seeds should draw different completions"
    for row, generation in enumerate(rows):  # every token reported once, under its row, in order
        assert [t for r, _, t in seen if r == row] == generation.ids


def test_rows_that_stop_leave_the_batch_and_the_rest_go_on() -> None:
    """With an EOS that some rows draw early, the stopped rows drop out and the others still match."""
    model, codec = _toy()
    prompt = codec.encode_prompt("the sea is")
    samplings = [Sampling(temperature=1.5, seed=100 + i) for i in range(8)]
    free = [_alone(model, prompt, s, frozenset(), 16) for s in samplings]
    # An "EOS" that half the rows draw somewhere in their text: they stop there, the rest run to the limit.
    common = min({t for g in free for t in g.ids}, key=lambda t: abs(sum(t in g.ids for g in free) - 4))
    eos = frozenset({common})
    rows = decode_group(model, prompt, samplings, max_new_tokens=16, eos_ids=eos, check_cancelled=lambda: None)
    alone = [_alone(model, prompt, s, eos, 16) for s in samplings]
    assert rows == alone
    assert {g.stop_reason for g in rows} == {"eos", "max_new_tokens"}


def test_shared_prefill_equals_prefilling_every_row() -> None:
    model, codec = _toy()
    prompt = codec.encode_prompt("a quiet morning")
    samplings = [Sampling(temperature=0.9, top_p=0.95, seed=3 + i) for i in range(4)]
    kwargs = dict(max_new_tokens=12, eos_ids=codec.eos_ids, check_cancelled=lambda: None)
    assert decode_group(model, prompt, samplings, **kwargs) == decode_group(
        model, prompt, samplings, shared_prefill=False, **kwargs
    )


def test_rows_steered_at_their_own_strengths_equal_each_strength_alone() -> None:
    """The sweep's batch: one row per strength, each with its own steering scale, prompt included."""
    model, codec = _toy()
    prompt = codec.encode_prompt("the sea is")
    width = model.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    vectors = {layer: torch.randn(width, generator=generator).tolist() for layer in (1, 2)}
    scales = [{1: s, 2: s / 2} for s in (0.0, 4.0, -4.0, 12.0)]
    for sampling in (Sampling(), Sampling(temperature=0.8, seed=5)):
        rows = steered_rows_decode(
            model,
            prompt,
            [added(vectors, scale) for scale in scales],
            max_new_tokens=14,
            sampling=sampling,
            eos_ids=codec.eos_ids,
            on_token=lambda r, i, t: None,
            check_cancelled=lambda: None,
        )
        alone = [
            steered_decode(
                model,
                prompt,
                added(vectors, scale),
                max_new_tokens=14,
                sampling=sampling,
                eos_ids=codec.eos_ids,
                on_token=lambda i, t: None,
                check_cancelled=lambda: None,
            )
            for scale in scales
        ]
        assert rows == alone
        assert len({tuple(g.ids) for g in rows}) > 1, "the strengths should steer the rows apart"
