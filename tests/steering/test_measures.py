"""The measures (cost, behaviour, perplexity) against an independent computation: transformers' own model, one
sequence and one strength at a time, with a forward hook that adds the same vector after the same block."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.steering.intervention import added
from ster.engine.steering.measures import (
    Rows,
    behaviour,
    behaviours,
    greedy_continuations,
    kl_cost,
    kl_costs,
    perplexity,
)
from tests.model.test_families import build, text_layers

TOLERANCE = 1e-5


def models(kind: str, where: Path):
    if kind == "toy":
        path, reference = TOY_DIR, AutoModelForCausalLM.from_pretrained(TOY_DIR, dtype=torch.float32).eval()
    else:
        path, reference = build(kind, where)
    source = resolve_model(str(path))
    return reference, load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))


@pytest.fixture(scope="module", params=["toy", "qwen2", "gemma3_text"])
def pair_of_models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return models(request.param, tmp_path_factory.mktemp(request.param))


def hf_log_probs(model, ids: list[int], additions: dict[int, torch.Tensor]) -> torch.Tensor:
    """transformers' log-softmax [T, V] of ``ids`` with ``additions[layer]`` added to that layer's output."""

    def hook_for(vector: torch.Tensor):
        def hook(module, args, output):
            if isinstance(output, tuple):
                return (output[0] + vector, *output[1:])
            return output + vector

        return hook

    layers = text_layers(model)
    handles = [layers[layer].register_forward_hook(hook_for(vector)) for layer, vector in additions.items()]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
    finally:
        for handle in handles:
            handle.remove()
    return torch.log_softmax(logits.double(), dim=-1)


def direction(width: int, seed: int) -> list[float]:
    vector = torch.randn(width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (vector / vector.norm()).tolist()


@pytest.mark.parametrize("first", [0, 1])
def test_kl_and_behaviour_equal_transformers_with_a_hook(pair_of_models, first: int) -> None:
    """Steered from block 0, and from block 1 on (where the rows share block 0, run once)."""
    reference, decoder = pair_of_models
    width, count = decoder.config.hidden_size, len(decoder.blocks)
    vectors = {first: direction(width, 1), count - 1: direction(width, 2)}
    scales = [{}, {first: 2.0, count - 1: -1.5}, {first: -4.0, count - 1: 3.0}]  # row 0 unsteered
    rows = Rows.of(decoder, [added(vectors, row) for row in scales])
    prompt, continuation = [1, 14, 20, 33, 41], [52, 60, 71, 2]

    cost = kl_cost(decoder, prompt, continuation, rows)
    ids = prompt + continuation[:-1]
    base = hf_log_probs(reference, ids, {})
    for r, row in enumerate(scales):
        steered = hf_log_probs(reference, ids, {layer: torch.tensor(vectors[layer]) * s for layer, s in row.items()})
        kl = (base.exp() * (base - steered)).sum(-1)[len(prompt) - 1 :]  # one per continuation token
        assert abs(cost.first[r] - float(kl[0])) <= TOLERANCE
        assert abs(cost.mean[r] - float(kl.mean())) <= TOLERANCE
    assert cost.first[0] == 0.0 and cost.mean[0] == 0.0 and cost.mean[1] > 0.0

    positive, negative = [1, 14, 20, 33, 41, 52], [1, 14, 20, 60, 71, 80, 90]  # a shared prompt of 3 ids
    gaps = behaviour(decoder, positive, negative, rows)
    for r, row in enumerate(scales):
        additions = {layer: torch.tensor(vectors[layer]) * s for layer, s in row.items()}
        pos, neg = hf_log_probs(reference, positive, additions), hf_log_probs(reference, negative, additions)
        want = sum(float(pos[i - 1, positive[i]]) for i in range(3, len(positive))) - sum(
            float(neg[i - 1, negative[i]]) for i in range(3, len(negative))
        )
        assert abs(gaps[r] - want) <= TOLERANCE


def test_packed_prompts_and_pairs_measure_as_each_alone(pair_of_models) -> None:
    """Several prompts (and pairs) in one packed row, sharing their common prefix, give each one's measures."""
    reference, decoder = pair_of_models
    width = decoder.config.hidden_size
    rows = Rows.of(decoder, [added({1: direction(width, 3)}, row) for row in ({}, {1: 2.5}, {1: -3.0})])
    items = [([1, 14, 20, 33], [41, 52, 2]), ([1, 14, 20, 60, 71], [80]), ([1, 14, 5], [9, 13, 17, 21])]
    together = kl_costs(decoder, items, rows)
    for (prompt, continuation), cost in zip(items, together, strict=True):
        alone = kl_cost(decoder, prompt, continuation, rows)
        assert cost.mean == pytest.approx(alone.mean, abs=TOLERANCE)
        assert cost.first == pytest.approx(alone.first, abs=TOLERANCE)
    pairs = [([1, 14, 20, 33, 41], [1, 14, 20, 60]), ([1, 14, 7, 8], [1, 14, 7, 9, 10]), ([1, 5, 6], [1, 5, 7])]
    for pair, gaps in zip(pairs, behaviours(decoder, pairs, rows), strict=True):
        assert gaps == pytest.approx(behaviour(decoder, *pair, rows), abs=TOLERANCE)


def test_a_pair_with_no_shared_prompt_is_scored_from_each_sides_second_token(pair_of_models) -> None:
    reference, decoder = pair_of_models
    positive, negative = [14, 20, 33], [60, 71, 80, 90]
    [gap] = behaviour(decoder, positive, negative, Rows.unsteered())
    pos, neg = hf_log_probs(reference, positive, {}), hf_log_probs(reference, negative, {})
    want = sum(float(pos[i - 1, positive[i]]) for i in range(1, 3)) - sum(
        float(neg[i - 1, negative[i]]) for i in range(1, 4)
    )
    assert abs(gap - want) <= TOLERANCE


def test_perplexity_and_greedy_continuations_equal_transformers(pair_of_models) -> None:
    reference, decoder = pair_of_models
    prompts = [[1, 14, 20, 33, 41], [1, 22], [1, 5, 9, 13, 17, 21, 25, 29]]
    continuations = greedy_continuations(decoder, prompts, 6, frozenset({2}), batch_size=2)
    for prompt, continuation in zip(prompts, continuations, strict=True):
        ids = list(prompt)
        while len(ids) - len(prompt) < 6:  # transformers' greedy choice, one full forward per token
            ids.append(int(hf_log_probs(reference, ids, {})[-1].argmax()))
            if ids[-1] == 2:
                break
        assert continuation == ids[len(prompt) :]
        lp = hf_log_probs(reference, ids, {})
        want = math.exp(-sum(float(lp[i - 1, ids[i]]) for i in range(len(prompt), len(ids))) / len(continuation))
        assert perplexity(decoder, prompt, continuation) == pytest.approx(want, rel=1e-5)
    assert perplexity(decoder, prompts[0], []) is None


def test_rows_that_settle_leave_the_batch_and_the_rest_decode_as_alone(pair_of_models) -> None:
    """Rows of one batch, several kinds of edit, stop as ``settled`` says (at different steps), the prompts' shared
    prefix prefilled once a kind: every row's ids are those of its prompt decoded alone under its edit, up to
    where it settled."""
    _, decoder = pair_of_models
    generator = torch.Generator().manual_seed(3)
    direction = torch.randn(decoder.config.hidden_size, generator=generator)
    direction = (direction / direction.norm()).tolist()
    own = [[14, 20, 33, 41], [22], [5, 9, 13, 17, 21, 25, 29], [7, 3]]
    prompts = [[1, 30, 11, *tail] for tail in own] * 3  # a prefix every prompt shares, as a chat template's
    kinds = [added({1: direction}, {1: scale}) for scale in (0.0, 2.0, -4.0)]
    plans = [kind for kind in kinds for _ in own]  # rows of one kind share the prefix's keys and values

    def settled(ids: list[int]) -> bool:
        return len(ids) >= 2 and ids[-1] % 3 == 0

    together = greedy_continuations(decoder, prompts, 7, frozenset({2}), batch_size=12, plans=plans, settled=settled)
    for prompt, plan, ids in zip(prompts, plans, together, strict=True):
        [alone] = greedy_continuations(decoder, [prompt], 7, frozenset({2}), plans=[plan])
        stop = next((n for n in range(1, len(alone) + 1) if settled(alone[:n])), len(alone))
        assert ids == alone[:stop]
    assert len({len(ids) for ids in together}) > 1  # rows did stop at different steps
