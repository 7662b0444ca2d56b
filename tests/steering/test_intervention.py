"""Ablation and clamping, checked against what they promise and against an independent computation.

What they promise: after an ablation the stream has no component along the direction at any ablated site
(an ablation inside a block edits the block's writes, so the stream after it carries none), and after a
clamp the component is the target, at every position. The independent computation is
transformers' own model with forward hooks written here (the stream edited by the formula, not by Ster's
hooks), whose logits Ster's edited forward must give. A batch whose rows steer, ablate and clamp at once gives
each row the text it gets alone.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from ster.engine.model.config import load_config
from ster.engine.model.hooks import INPUT
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import build_job_request
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import EMBEDDING, Edit, Plan, Profile, added, projecting, sites
from ster.engine.steering.runs import steered_decode, steered_rows_decode
from tests.model.test_families import build, text_layers
from tests.steering.test_measures import direction, models

TOLERANCE = 1e-5
IDS = [1, 14, 20, 33, 41, 52, 60, 71]


@pytest.fixture(scope="module", params=["toy", "qwen2", "gemma3_text", "gemma2"])
def pair_of_models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """transformers' model and Ster's decoder of one checkpoint (gemma2 runs through transformers in Ster too)."""
    if request.param == "gemma2":
        path, reference = build("gemma2", tmp_path_factory.mktemp("gemma2"))
        source = resolve_model(str(path))
        return reference, load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    return models(request.param, tmp_path_factory.mktemp(request.param))


def test_the_embedding_site_is_the_hooks_input_site() -> None:
    assert EMBEDDING == INPUT


def test_a_profile_peaks_and_falls_off_as_heretics_does() -> None:
    flat = Profile()
    assert [flat.weight(site) for site in (-1, 0, 7)] == [1.0, 1.0, 1.0] and not flat.shaped
    shaped = Profile(peak_weight=1.2, peak_layer=4, min_weight=0.2, falloff=2)
    assert [round(shaped.weight(site), 6) for site in range(1, 8)] == [0.0, 0.2, 0.7, 1.2, 0.7, 0.2, 0.0]
    assert Profile(peak_weight=0.5, peak_layer=3, falloff=0).weight(3) == 0.5
    assert Profile(peak_weight=0.5, peak_layer=3, falloff=0).weight(4) == 0.0
    for bad, sentence in (
        ({"min_weight": 0.3}, "give --peak-layer too"),
        ({"peak_layer": 2, "min_weight": 0.3}, "give --falloff too"),
        ({"peak_layer": 2, "falloff": -1}, "--falloff must be 0 or more layers"),
    ):
        with pytest.raises(ValueError, match=sentence):
            Profile(**bad)


def test_each_mode_has_its_sites_and_layers_narrow_them() -> None:
    assert sites("add", None, [2, 5], 8) == [2, 5]
    assert sites("ablate", None, [2], 4) == [EMBEDDING, 0, 1, 2, 3]
    assert sites("clamp", [1, 3], [2], 4) == [1, 3]
    with pytest.raises(Refusal, match="--layers names layer 3, where the artifact has no direction to add"):
        sites("add", [2, 3], [2, 5], 8)
    directions = {2: [1.0, 0.0], 5: [0.0, 1.0]}
    plan = projecting(directions, [EMBEDDING, 0, 3, 4, 7], Profile(), weight=0.5)
    assert {site: edit.direction for site, edit in plan.items()} == {
        EMBEDDING: (1.0, 0.0),  # the lowest layer's
        0: (1.0, 0.0),
        3: (1.0, 0.0),  # 2 and 5 are one and two away
        4: (0.0, 1.0),
        7: (0.0, 1.0),
    }
    assert {edit.weight for edit in plan.values()} == {0.5} and {edit.target for edit in plan.values()} == {0.0}
    assert set(projecting(directions, [0, 7], Profile(), direction_layer=5).values()) == {
        Edit((0.0, 1.0), weight=1.0, on_writes=True)  # inside a block, an ablation edits the block's writes
    }
    assert added(directions, {2: 3.0, 5: 0.0}) == {2: Edit((1.0, 0.0), add=3.0)}  # strength 0: no edit at all


def _record(decoder, plan: Plan):
    """Ster's edited forward of IDS, with the stream at every site read after the edit (hooks run in order)."""
    seen: dict[int, torch.Tensor] = {}

    def after(site: int):
        def hook(module, args, output):
            seen[site] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        return hook

    def before(module, args, kwargs):
        seen[EMBEDDING] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    edits = RowEdits.of(decoder, [plan])
    assert edits is not None
    with ExitStack() as stack, torch.inference_mode():
        stack.enter_context(edits.applied(decoder))
        handles = [decoder.blocks[site].register_forward_hook(after(site)) for site in range(len(decoder.blocks))]
        handles.append(decoder.blocks[0].register_forward_pre_hook(before, with_kwargs=True))
        stack.callback(lambda: [handle.remove() for handle in handles])
        logits = decoder(torch.tensor([IDS]), vocab="all").require_logits()[0]
    return logits, seen


def test_ablation_leaves_no_component_and_a_clamp_its_target_at_every_site(pair_of_models) -> None:
    _, decoder = pair_of_models
    width, count = decoder.config.hidden_size, len(decoder.blocks)
    directions = {1: direction(width, 7)}
    where = sites("ablate", None, [1], count)
    unit = torch.tensor(directions[1])
    _, ablated = _record(decoder, projecting(directions, where, Profile()))
    _, untouched = _record(decoder, {1: Edit(tuple(directions[1]), add=0.0, weight=0.0)})
    assert set(ablated) == set(where)
    for site, stream in ablated.items():
        along = (stream.double() @ unit.double()).abs().max()
        assert float(along) <= 1e-5 * float(stream.norm(dim=-1).max()), site
        if site == 0:  # the edit did something: the stream alone has a component there
            assert float((untouched[site].double() @ unit.double()).abs().max()) > 1e-2
    _, clamped = _record(decoder, projecting(directions, where, Profile(), targets={1: 2.5}))
    for site, stream in clamped.items():
        assert torch.allclose(
            stream.double() @ unit.double(), torch.full((1, len(IDS)), 2.5, dtype=torch.float64), atol=1e-4
        ), site


def _hf_logits(model, plan: Plan) -> torch.Tensor:
    """transformers' logits [T, V] of IDS with each site edited by hooks written from the formula: the stream at a
    block's output or the first block's input; for an ablation inside a block, each writer's output (the
    attention's ``o_proj``, the MLP's ``down_proj``) against the direction as the stream sees it (``g ⊙ v``
    normalised behind a norm of scale ``1 + w``, as Gemma's are)."""

    def edit(stream: torch.Tensor, change: Edit) -> torch.Tensor:
        v = torch.tensor(change.direction, dtype=stream.dtype)
        along = (stream * v).sum(-1, keepdim=True)
        return stream + change.weight * (change.target - along) * v + change.add * v

    def after(change: Edit):
        def hook(module, args, output):
            if isinstance(output, tuple):
                return (edit(output[0], change), *output[1:])
            return edit(output, change)

        return hook

    def before(change: Edit):
        def hook(module, args, kwargs):
            if args:
                return (edit(args[0], change), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": edit(kwargs["hidden_states"], change)}

        return hook

    def written(change: Edit, norm):
        v = torch.tensor(change.direction)
        if norm is not None:
            v = (1 + norm.weight.detach().float()) * v
            v = v / v.norm()

        def hook(module, args, output):
            return output - change.weight * (output * v).sum(-1, keepdim=True) * v

        return hook

    layers = text_layers(model)
    handles = []
    for site, change in plan.items():
        if site == EMBEDDING:
            handles.append(layers[0].register_forward_pre_hook(before(change), with_kwargs=True))
        elif change.on_writes:
            layer = layers[site]
            sandwich = hasattr(layer, "post_feedforward_layernorm")
            for module, norm in (
                (layer.self_attn.o_proj, layer.post_attention_layernorm if sandwich else None),
                (layer.mlp.down_proj, layer.post_feedforward_layernorm if sandwich else None),
            ):
                handles.append(module.register_forward_hook(written(change, norm)))
        else:
            handles.append(layers[site].register_forward_hook(after(change)))
    try:
        with torch.no_grad():
            return model(torch.tensor([IDS])).logits[0].float()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("mode", ["ablate", "clamp"])
def test_an_edited_forward_equals_transformers_with_the_formula_in_a_hook(pair_of_models, mode: str) -> None:
    reference, decoder = pair_of_models
    width, count = decoder.config.hidden_size, len(decoder.blocks)
    directions = {0: direction(width, 3), count - 1: direction(width, 4)}
    profile = Profile(peak_weight=0.9, peak_layer=1, min_weight=0.3, falloff=2)
    where = sites(mode, None, list(directions), count)
    targets = {0: 1.5, count - 1: -2.0} if mode == "clamp" else None
    plan = projecting(directions, where, profile, targets=targets)
    logits, _ = _record(decoder, plan)
    want = _hf_logits(reference, plan)
    assert (logits - want).abs().max() <= TOLERANCE * max(1.0, float(want.abs().max()))
    assert (logits - _hf_logits(reference, {})).abs().max() > 1e-3  # it changed something


def test_rows_that_steer_ablate_and_clamp_in_one_batch_each_decode_as_alone(tmp_path: Path) -> None:
    reference, decoder = models("toy", tmp_path)
    width, count = decoder.config.hidden_size, len(decoder.blocks)
    directions = {2: direction(width, 5)}
    plans: list[Plan] = [
        {},
        added(directions, {2: 3.0}),
        projecting(directions, sites("ablate", None, [2], count), Profile()),
        projecting(directions, sites("clamp", [1, 2], [2], count), Profile(peak_weight=0.7), targets={2: 1.0}),
        projecting(directions, sites("ablate", None, [2], count), Profile(peak_layer=2, falloff=1, min_weight=0.5)),
    ]
    greedy = Sampling(0.0, None, 0)
    together = steered_rows_decode(
        decoder,
        IDS[:5],
        plans,
        max_new_tokens=8,
        sampling=greedy,
        eos_ids=frozenset(),
        on_token=lambda *a: None,
        check_cancelled=lambda: None,
    )
    for plan, row in zip(plans, together):
        alone = steered_decode(
            decoder,
            IDS[:5],
            plan,
            max_new_tokens=8,
            sampling=greedy,
            eos_ids=frozenset(),
            on_token=lambda *a: None,
            check_cancelled=lambda: None,
        )
        assert row.ids == alone.ids
    assert len({tuple(row.ids) for row in together}) > 2  # the rows went their own ways


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        ({"mode": "ablate", "strength": "0.4x"}, "--strength 0.4x is not a weight: with --mode ablate"),
        ({"mode": "ablate", "strength": "-1"}, "--strength -1 is not a weight"),
        ({"peak_layer": "3"}, "give --mode ablate or clamp"),
        ({"mode": "ablate", "falloff": "2"}, "give --peak-layer too"),
        ({"mode": "ablate", "direction_layer": "-1"}, "--direction-layer must be a layer index"),
        ({"mode": "ablate", "layers": "2-"}, "--layers takes all"),
        ({"mode": "flip"}, "--mode must be 'add', 'ablate' or 'clamp'"),
    ],
)
def test_a_bad_intervention_is_refused_in_one_sentence(fields: dict[str, str], sentence: str) -> None:
    with pytest.raises(Refusal, match=sentence):
        build_job_request("generate", model="ster:toy", prompt="question :", vector="calm.ster.json", **fields)
    if "strength" in fields:
        swept = {"strengths" if k == "strength" else k: v for k, v in fields.items()}
        with pytest.raises(Refusal, match=sentence.replace("--strength ", "--strengths ")):
            build_job_request("sweep", model="ster:toy", prompts="ster:prompts", vector="calm.ster.json", **swept)
