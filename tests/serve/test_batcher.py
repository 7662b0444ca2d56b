"""Continuous batching: rows that join a running batch at different steps, each with its own edits, give the text
each gives alone; windows, prompt positions and conditions do what they say, checked against hooks and hidden
states computed here (transformers' own model for the conditions' measures).

The batch is stepped on the test's thread (:meth:`Batcher.step`), so when each row joins is decided by the test,
not by timing.
"""

from __future__ import annotations

import pytest
import torch

from ster.engine.model.hooks import edited
from ster.engine.model.sampling import Sampling
from ster.engine.serving.batcher import (
    Batcher,
    EndEvent,
    RowCondition,
    RowIntervention,
    RowText,
    ServedRow,
    TokenEvent,
)
from ster.engine.serving.spec import Condition
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import EMBEDDING, Plan, Profile, added, projecting, sites
from ster.engine.steering.runs import steered_decode
from tests.model.test_families import text_layers
from tests.steering.test_measures import direction, models

GREEDY = Sampling(0.0, None, 0)
PROMPTS = [
    [1, 14, 20, 33, 41, 52, 60, 71],
    [1, 9, 31, 44],
    [1, 61, 62, 17, 18, 19, 23, 29, 30, 35, 36, 40],
    [1, 5],
    [1, 77, 12, 13],
]


class Codec:
    """What :class:`RowText` needs of a codec, for rows whose text is not looked at."""

    class Stream:
        def step(self, tokenizer: object, token: int) -> str:
            return f"<{token}>"

    tokenizer = None

    def stream(self) -> Stream:
        return Codec.Stream()


class Collected:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.end: EndEvent | None = None

    def __call__(self, event: object) -> None:
        if isinstance(event, TokenEvent) and event.token >= 0:
            self.tokens.append(event.token)
        elif isinstance(event, EndEvent):
            self.end = event


def row(prompt: list[int], n: int, interventions: list[RowIntervention] | None = None) -> tuple[ServedRow, Collected]:
    out = Collected()
    served = ServedRow(prompt, GREEDY, n, frozenset(), RowText(Codec(), []), out, interventions or [])
    return served, out


def everywhere(plan: Plan) -> RowIntervention:
    return RowIntervention(plan, prompt=True, positions=None, generation=True, first_k=None, after_k=None)


def alone(decoder, prompt: list[int], plan: Plan, n: int) -> list[int]:
    done = steered_decode(
        decoder,
        prompt,
        plan,
        max_new_tokens=n,
        sampling=GREEDY,
        eos_ids=frozenset(),
        on_token=lambda *a: None,
        check_cancelled=lambda: None,
    )
    return done.ids


def run(batcher: Batcher, joins: dict[int, list[ServedRow]], outs: list[Collected], limit: int = 200) -> None:
    """Step the batch, queueing ``joins[step]`` before step ``step``, until every row has ended."""
    for step in range(limit):
        for each in joins.get(step, []):
            batcher.queue(each)
        batcher.step()
        if all(out.end is not None for out in outs) and not batcher.pending:
            return
    raise AssertionError("the batch did not finish")


@pytest.mark.parametrize("family", ["toy", "qwen2", "gemma3_text"])
def test_rows_joining_a_running_batch_at_different_steps_each_decode_as_alone(family, tmp_path) -> None:
    """Prompts of different lengths (longer than gemma's sliding window of 5), steered, ablated, clamped and bare,
    joining at steps 0, 0, 2, 3 and 7, and leaving at different steps; every row equals the row decoded alone."""
    _, decoder = models(family, tmp_path)
    width, count = decoder.config.hidden_size, len(decoder.blocks)
    directions = {1: direction(width, 3)}
    plans: list[Plan] = [
        added(directions, {1: 4.0}),
        {},
        projecting(directions, sites("ablate", None, [1], count), Profile()),
        projecting(directions, sites("clamp", None, [1], count), Profile(), targets={1: 2.0}),
        added(directions, {1: -3.0}),
    ]
    budgets = [9, 4, 12, 6, 5]
    rows = [row(p, n, [everywhere(plan)] if plan else []) for p, plan, n in zip(PROMPTS, plans, budgets, strict=True)]
    batcher = Batcher(decoder)
    run(batcher, {0: [rows[0][0], rows[1][0]], 2: [rows[2][0]], 3: [rows[3][0]], 7: [rows[4][0]]}, [r[1] for r in rows])
    assert batcher.peak_rows >= 3, "the rows should have overlapped in the batch"
    for (served, out), plan, n in zip(rows, plans, budgets, strict=True):
        assert out.end is not None and out.end.reason == "length" and out.end.completion_tokens == n
        assert out.tokens == alone(decoder, served.prompt_ids, plan, n)
    assert batcher.cache is None and batcher.cache_bytes == 0  # every row left, and the idle batch holds nothing


def test_two_interventions_of_one_row_both_apply_and_other_rows_have_none(tmp_path) -> None:
    """A row with two interventions at the same layer equals one plan of their summed additions, while a row of
    one intervention beside it equals that alone."""
    _, decoder = models("toy", tmp_path)
    width = decoder.config.hidden_size
    first, second = direction(width, 1), direction(width, 2)
    both = [everywhere(added({2: first}, {2: 3.0})), everywhere(added({2: second}, {2: -2.0}))]
    rows = [row(PROMPTS[0], 8, both), row(PROMPTS[1], 8, [everywhere(added({2: first}, {2: 3.0}))])]
    run(Batcher(decoder), {0: [r[0] for r in rows]}, [r[1] for r in rows])
    summed = (torch.tensor(first) * 3.0 - torch.tensor(second) * 2.0).to(decoder.lm_head.weight.dtype)
    with edited(decoder, [2], lambda site, hidden: hidden + summed):
        want = alone(decoder, PROMPTS[0], {}, 8)
    assert rows[0][1].tokens == want
    assert rows[1][1].tokens == alone(decoder, PROMPTS[1], added({2: first}, {2: 3.0}), 8)


def reference(decoder, prompt: list[int], n: int, prompt_edit, step_edit) -> list[int]:
    """Greedy decoding with hooks written here: ``prompt_edit(hidden)`` on the prefill, ``step_edit(index, hidden)``
    on the forward that reads generated token ``index`` back in."""
    cache = decoder.new_cache(1, len(prompt) + n)
    out: list[int] = []
    with torch.inference_mode():
        with edited(decoder, [2], lambda site, hidden: prompt_edit(hidden)):
            logits = decoder(torch.tensor([prompt]), cache=cache).require_logits()
        while True:
            token = int(logits[0].argmax())
            out.append(token)
            if len(out) == n:
                return out
            index = len(out) - 1
            with edited(decoder, [2], lambda site, hidden, index=index: step_edit(index, hidden)):
                logits = decoder(torch.tensor([[token]]), cache=cache).require_logits()


def test_windows_and_prompt_positions_edit_only_where_they_say(tmp_path) -> None:
    _, decoder = models("toy", tmp_path)
    v = torch.tensor(direction(decoder.config.hidden_size, 4))
    plan = added({2: v.tolist()}, {2: 6.0})
    push = 6.0 * v

    def at_last(hidden):
        hidden = hidden.clone()
        hidden[:, -1] += push
        return hidden

    cases = [
        # (intervention, prompt edit, step edit)
        (
            RowIntervention(plan, True, (-1,), False, None, None),
            at_last,
            lambda i, h: h,
        ),
        (
            RowIntervention(plan, False, None, True, 3, None),
            lambda h: h,
            lambda i, h: h + push if i < 3 else h,
        ),
        (
            RowIntervention(plan, True, None, True, None, 2),
            lambda h: h + push,
            lambda i, h: h + push if i >= 2 else h,
        ),
    ]
    rows = [row(PROMPTS[k], 9, [each]) for k, (each, _, _) in enumerate(cases)]
    bare = row(PROMPTS[3], 9)
    run(Batcher(decoder), {0: [rows[0][0], bare[0]], 1: [rows[1][0]], 4: [rows[2][0]]}, [r[1] for r in [*rows, bare]])
    for k, ((_, prompt_edit, step_edit), (served, out)) in enumerate(zip(cases, rows, strict=True)):
        assert out.tokens == reference(decoder, served.prompt_ids, 9, prompt_edit, step_edit), f"case {k}"
    assert bare[1].tokens == alone(decoder, PROMPTS[3], {}, 9)
    windowless = alone(decoder, PROMPTS[1], plan, 9)
    assert rows[1][1].tokens != windowless, "a window of 3 tokens should differ from steering every token"


def test_a_condition_applies_where_the_prompts_state_passes_and_nowhere_else(tmp_path) -> None:
    """The condition's measure equals transformers' own hidden state of the prompt (mean over its tokens, cosine
    with the direction); the row whose prompt passes is steered, the one whose prompt fails is not."""
    reference_model, decoder = models("toy", tmp_path)
    layer = 1
    with torch.no_grad():
        states = [
            reference_model(torch.tensor([p]), output_hidden_states=True).hidden_states[layer + 1][0].mean(0).double()
            for p in PROMPTS[:2]
        ]
    gap = states[0] / states[0].norm() - states[1] / states[1].norm()
    unit = (gap / gap.norm()).tolist()
    cosines = [float(s @ torch.tensor(unit, dtype=torch.float64) / s.norm()) for s in states]
    assert cosines[0] > cosines[1]
    rule = Condition(vector="c", layer=layer, threshold=(cosines[0] + cosines[1]) / 2)
    condition = RowCondition(layer, tuple(unit), "cosine", "mean", rule.passes)
    v = direction(decoder.config.hidden_size, 6)
    plan = added({2: v}, {2: 5.0})
    conditional = RowIntervention(plan, True, None, True, None, None, condition)
    rows = [row(p, 8, [conditional]) for p in PROMPTS[:2]]
    run(Batcher(decoder), {0: [r[0] for r in rows]}, [r[1] for r in rows])
    first, second = rows[0][1], rows[1][1]
    assert first.end is not None and second.end is not None
    assert first.end.conditions == [True] and second.end.conditions == [False]
    assert first.end.measures[0] == pytest.approx(cosines[0], abs=1e-4)
    assert second.end.measures[0] == pytest.approx(cosines[1], abs=1e-4)
    assert first.tokens == alone(decoder, PROMPTS[0], plan, 8)
    assert second.tokens == alone(decoder, PROMPTS[1], {}, 8)
    assert first.tokens != alone(decoder, PROMPTS[0], {}, 8), "the steering should change the passing row"


def test_a_cancelled_row_leaves_at_the_next_step_and_the_others_go_on(tmp_path) -> None:
    _, decoder = models("toy", tmp_path)
    rows = [row(p, 10) for p in PROMPTS[:3]]
    batcher = Batcher(decoder)
    for served, _ in rows:
        batcher.queue(served)
    batcher.step()
    batcher.step()
    rows[1][0].cancelled.set()
    run(batcher, {}, [r[1] for r in rows])
    assert rows[1][1].end is not None and rows[1][1].end.reason == "cancelled"
    assert len(rows[1][1].tokens) == 2
    for k in (0, 2):
        assert rows[k][1].tokens == alone(decoder, PROMPTS[k], {}, 10)


def test_a_stop_string_ends_a_row_and_is_never_sent() -> None:
    class Words(Codec):
        class Stream:
            def step(self, tokenizer: object, token: int) -> str:
                return {1: "a", 2: "b", 3: "c", 4: "STOP", 5: "x"}[token]

        def stream(self) -> Words.Stream:  # type: ignore[override]
            return Words.Stream()

    text = RowText(Words(), ["cST"])
    sent = []
    for token in (1, 2, 3, 4, 5):
        piece, stopped = text.feed(token)
        sent.append(piece)
        if stopped:
            break
    assert "".join(sent) == "ab" and stopped
    loose = RowText(Words(), ["zz"])
    assert "".join(loose.feed(t)[0] for t in (1, 2, 3)) + loose.rest() == "abc"


def test_an_ablation_row_in_the_batch_equals_the_ablation_alone_on_gemma(tmp_path) -> None:
    """Gemma's sandwich norms: the ablation edits the writes before their norm, in a batch as alone."""
    _, decoder = models("gemma3_text", tmp_path)
    count = len(decoder.blocks)
    directions = {0: direction(decoder.config.hidden_size, 8)}
    plan = projecting(directions, [EMBEDDING, *range(count)], Profile(peak_weight=0.8))
    rows = [row(PROMPTS[2], 7, [everywhere(plan)]), row(PROMPTS[0], 7)]
    run(Batcher(decoder), {0: [rows[1][0]], 2: [rows[0][0]]}, [r[1] for r in rows])
    assert rows[0][1].tokens == alone(decoder, PROMPTS[2], plan, 7)
    assert rows[1][1].tokens == alone(decoder, PROMPTS[0], {}, 7)
    assert RowEdits.of(decoder, [plan]) is not None and text_layers is not None


def test_a_ragged_cache_aligns_rows_right_grows_and_drops_the_columns_no_row_uses(tmp_path) -> None:
    from ster.engine.model.decoder import RaggedCache

    _, decoder = models("toy", tmp_path)
    config = decoder.config
    cache = RaggedCache(config, torch.float32, torch.device("cpu"), rows=2)

    def filled(length: int, value: float):
        alone = decoder.new_cache(1, length)
        alone.keys.fill_(value)
        alone.values.fill_(-value)
        alone.length = length
        return alone

    for length, value in ((8, 1.0), (4, 2.0), (12, 3.0)):  # the third outgrows both the rows and the columns
        cache.add(filled(length, value))
    assert cache.rows == 3 and cache.length == 12 and cache.capacity[0] >= 3
    mask = cache.key_mask(0)
    assert mask.sum(1).tolist() == [8, 4, 12] and mask[:, -1].all()  # right-aligned: every row ends together
    for row, (length, value) in enumerate(((8, 1.0), (4, 2.0), (12, 3.0))):
        assert (cache.keys[:, row, :, 12 - length : 12] == value).all()
        assert (cache.values[:, row, :, 12 - length : 12] == -value).all()
    cache.remove(2)  # the longest row leaves: the four columns only it used leave the window
    assert cache.rows == 2 and cache.length == 8
    assert cache.key_mask(0).sum(1).tolist() == [8, 4]
    assert (cache.keys[:, 1, :, 4:8] == 2.0).all() and (cache.keys[:, 0, :, :8] == 1.0).all()
    cache.reserve(1)
    assert cache.key_mask(1).shape == (2, 9)


def test_rows_through_different_adapters_and_none_each_decode_as_alone(tmp_path) -> None:
    """Two adapters (different targets and ranks) and rows through none, joining at different steps, one of them also
    steered: each equals the row decoded alone with its adapter attached the usual way."""
    from ster.engine.model.adapters.lora import attached, load_adapter
    from tests.tune.adapter_files import write_adapter

    _, decoder = models("toy", tmp_path)
    write_adapter(tmp_path / "first.safetensors", b_scale=0.5, seed=1)
    write_adapter(tmp_path / "second.safetensors", b_scale=0.5, seed=2, rank=2, targets=("up", "down", "query"))
    first = load_adapter(tmp_path / "first.safetensors", decoder.config, torch.device("cpu"))[1]
    second = load_adapter(tmp_path / "second.safetensors", decoder.config, torch.device("cpu"))[1]
    steer = added({2: direction(decoder.config.hidden_size, 9)}, {2: 3.0})
    cases = [(first, {}), (None, {}), (second, {}), (first, steer), (second, {})]
    rows = []
    for k, (adapter, plan) in enumerate(cases):
        served, out = row(PROMPTS[k], 8, [everywhere(plan)] if plan else [])
        served.adapter = adapter
        rows.append((served, out))
    run(
        Batcher(decoder),
        {0: [rows[0][0], rows[1][0]], 1: [rows[2][0], rows[3][0]], 3: [rows[4][0]]},
        [r[1] for r in rows],
    )
    for k, ((adapter, plan), (served, out)) in enumerate(zip(cases, rows, strict=True)):
        with attached(decoder, adapter):
            want = alone(decoder, served.prompt_ids, plan, 8)
        assert out.tokens == want, f"row {k}"
    bare = [alone(decoder, PROMPTS[k], {}, 8) for k in (0, 2)]
    assert rows[0][1].tokens != bare[0] or rows[2][1].tokens != bare[1], "the adapters should change the text"


def test_one_adapter_shared_by_every_row_is_attached_as_it_is(tmp_path) -> None:
    from ster.engine.model.adapters.lora import load_adapter
    from ster.engine.serving.batcher import _stacked_adapters
    from tests.tune.adapter_files import write_adapter

    _, decoder = models("toy", tmp_path)
    write_adapter(tmp_path / "only.safetensors", b_scale=0.5)
    only = load_adapter(tmp_path / "only.safetensors", decoder.config, torch.device("cpu"))[1]
    rows = [row(p, 4)[0] for p in PROMPTS[:3]]
    for served in rows:
        served.adapter = only
    factors = _stacked_adapters(decoder, rows)
    assert factors and all(lora.ranks is None and lora.row_scale is None for _, _, lora in factors)
    rows[1].adapter = None
    mixed = _stacked_adapters(decoder, rows)
    assert all(lora.row_scale is not None and lora.row_scale.flatten().tolist()[1] == 0.0 for _, _, lora in mixed)


def test_text_held_back_for_a_stop_string_that_never_comes_is_sent_when_the_row_ends(tmp_path) -> None:
    """A row whose text ends at EOS on the start of a stop string still sends that start."""
    _, decoder = models("toy", tmp_path)
    plain = row(PROMPTS[0], 6)
    run(Batcher(decoder), {0: [plain[0]]}, [plain[1]])
    first_new = next(k for k, t in enumerate(plain[1].tokens) if k >= 2 and t not in plain[1].tokens[:k])
    tokens = plain[1].tokens[: first_new + 1]  # the last one is new: it ends the row as its EOS
    sent: list[str] = []
    collected = Collected()

    def sink(event: object) -> None:
        if isinstance(event, TokenEvent):
            sent.append(event.text)
        collected(event)

    held = RowText(Codec(), [f"<{tokens[-2]}>never"])
    served = ServedRow(PROMPTS[0], GREEDY, 10, frozenset({tokens[-1]}), held, sink)
    run(Batcher(decoder), {0: [served]}, [collected])
    assert collected.end is not None and collected.end.reason == "stop"  # at EOS, not at the stop string
    assert "".join(sent) == "".join(f"<{t}>" for t in tokens[:-1])
