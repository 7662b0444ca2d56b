"""``ster bake``: a direction folded into a checkpoint or a LoRA gives, in transformers' and PEFT's own models,
the logits of live ablation or steering in Ster; lm-eval's steering file, applied by lm-eval's own hooks, does
too; and what a format cannot carry is refused in one sentence with nothing written.

Live editing here is Ster's own decoder on the unbaked checkpoint with the plan's hooks; the baked side is
``transformers.AutoModelForCausalLM`` on the baked directory (and ``peft.PeftModel`` on the base), which knows
nothing of Ster.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ster.engine.model.config import load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.protocol.events import Error, Result
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.intervention import EMBEDDING, Profile, added, projecting, sites
from tests.model.test_families import build
from tests.steering.test_measures import direction

IDS = [1, 14, 20, 33, 41, 52, 60, 71]
EXACT = 1e-4
NATIVE = ["llama", "qwen2", "mistral", "qwen3", "phi3", "gemma3_text", "gemma3"]


@pytest.fixture(scope="module", params=NATIVE)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    if request.param == "llama":
        return "llama", TOY_DIR
    path, _ = build(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, path


def write_artifact(path: Path, model: Path, layers: list[int], seed: int = 3) -> dict[int, list[float]]:
    """A steering artifact for ``model`` with a random unit direction at each of ``layers`` (matched by name)."""
    config = load_config(resolve_model(str(model)).config)
    vectors = {layer: direction(config.hidden_size, seed + layer) for layer in layers}
    document = {
        "schema_version": 1,
        "product": "ster",
        "model": str(model),
        "trait_name": "calm",
        "method": "caa",
        "hidden_size": config.hidden_size,
        "strength_unit": "spread",
        "vectors": [
            {
                "layer": layer,
                "values": vector,
                "train_accuracy": 1.0,
                "train_margin": 1.0,
                "activation_norm": 4.0,
                "activation_spread": 2.0,
            }
            for layer, vector in vectors.items()
        ],
    }
    path.write_text(json.dumps(document))
    return vectors


def bake(**fields) -> Result | Error:
    return run_job("bake", build_job_request("bake", **fields), lambda event: None, threading.Event())


def live_logits(model: Path, plan) -> torch.Tensor:
    source = resolve_model(str(model))
    decoder = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    edits = RowEdits.of(decoder, [plan])
    with torch.inference_mode(), edits.applied(decoder) if edits else torch.inference_mode():
        return decoder(torch.tensor([IDS]), vocab="all").require_logits()[0]


def hf_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float()


def close(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def test_an_ablation_baked_into_a_checkpoint_and_a_lora_equals_live_ablation(family, tmp_path: Path) -> None:
    name, model = family
    config = load_config(resolve_model(str(model)).config)
    vectors = write_artifact(tmp_path / "a.json", model, [1])
    plan = projecting(vectors, sites("ablate", None, [1], config.num_hidden_layers), Profile())
    want = live_logits(model, plan)
    result = bake(model=str(model), vector=tmp_path / "a.json", mode="ablate", output=tmp_path / "baked")
    assert result.type == "result", result
    record = json.loads((tmp_path / "baked" / "ster-bake.json").read_text())
    assert record["mode"] == "ablate" and "as live ablation does" in record["note"]
    assert set(record["sites"]) == {"embedding", *map(str, range(config.num_hidden_layers))}
    baked = hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "baked", dtype=torch.float32).eval())
    base = hf_logits(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval())
    assert close(base, want) > 1e-3  # the ablation changed something
    assert close(baked, want) <= EXACT
    # Ster reads the baked checkpoint as any other: another fingerprint, the same logits
    source = resolve_model(str(tmp_path / "baked"))
    assert result.data["fingerprint"] == checkpoint_fingerprint(load_config(source.config), source.weights)
    assert result.data["fingerprint"] != checkpoint_fingerprint(config, resolve_model(str(model)).weights)
    assert close(live_logits(tmp_path / "baked", {}), baked) <= EXACT

    from peft import PeftModel

    lora = bake(model=str(model), vector=tmp_path / "a.json", mode="ablate", format="lora", output=tmp_path / "lora")
    if name == "qwen3":  # its attention output carries a bias, which a LoRA cannot change
        assert lora.type == "error" and lora.message.startswith("a LoRA changes weights, not biases")
        assert not (tmp_path / "lora").exists()
        return
    assert lora.type == "result", lora
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), tmp_path / "lora"
    ).eval()
    assert close(hf_logits(peft), want) <= EXACT  # the same change of weights as the checkpoint


def test_a_narrowed_and_shaped_ablation_bakes_exactly_too(tmp_path: Path) -> None:
    vectors = write_artifact(tmp_path / "a.json", TOY_DIR, [2])
    result = bake(
        model=str(TOY_DIR),
        vector=tmp_path / "a.json",
        mode="ablate",
        layers="1..3",
        peak_layer="1",
        falloff="2",
        min_weight="0.5",
        output=tmp_path / "b",
    )
    assert result.type == "result", result
    assert {site: value["weight"] for site, value in result.data["record"]["sites"].items()} == {"1": 1.0, "2": 0.75}
    plan = projecting(vectors, [1, 2], Profile(peak_layer=1, falloff=2, min_weight=0.5))
    baked = AutoModelForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32).eval()
    assert close(hf_logits(baked), live_logits(TOY_DIR, plan)) <= EXACT
    base = AutoModelForCausalLM.from_pretrained(TOY_DIR, dtype=torch.float32).eval()
    unit = torch.tensor(vectors[2], dtype=torch.float64)
    weight = dict(baked.named_parameters())["model.layers.1.self_attn.o_proj.weight"].double()
    assert float((unit @ weight).abs().max()) <= 1e-6  # block 1's attention writes nothing along the direction
    untouched = dict(base.named_parameters())["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(dict(baked.named_parameters())["model.layers.0.self_attn.o_proj.weight"], untouched)


def test_steering_baked_into_a_llama_checkpoint_equals_live_steering_and_other_families_are_refused(
    tmp_path: Path,
) -> None:
    vectors = write_artifact(tmp_path / "a.json", TOY_DIR, [1, 2])
    result = bake(model=str(TOY_DIR), vector=tmp_path / "a.json", strength="3", output=tmp_path / "steered")
    assert result.type == "result", result
    assert json.loads((tmp_path / "steered" / "config.json").read_text())["mlp_bias"] is True
    want = live_logits(TOY_DIR, added(vectors, {1: 3.0, 2: 3.0}))
    assert close(hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "steered").eval()), want) <= EXACT
    assert close(live_logits(tmp_path / "steered", {}), want) <= EXACT  # Ster's decoder reads the biases

    qwen2, _ = build("qwen2", tmp_path / "qwen2")
    write_artifact(tmp_path / "q.json", qwen2, [1])
    refused = bake(model=str(qwen2), vector=tmp_path / "q.json", output=tmp_path / "nothing")
    assert refused.type == "error" and refused.message == (
        "qwen2's layout in transformers has no bias on the MLP down projection to carry an added direction, so "
        "steering cannot be baked into its checkpoint; --format llama-cpp or lm-eval carries it"
    )
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize("mode", ["add", "ablate", "clamp"])
def test_lm_evals_steering_file_applied_by_lm_evals_own_hooks_equals_live_editing(tmp_path: Path, mode: str) -> None:
    hf_steered = pytest.importorskip("lm_eval.models.hf_steered")
    from functools import partial

    vectors = write_artifact(tmp_path / "a.json", TOY_DIR, [2])
    strength = {"add": "0.5x", "ablate": "1", "clamp": "1.5"}[mode]
    assert (
        bake(
            model=str(TOY_DIR),
            vector=tmp_path / "a.json",
            mode=mode,
            strength=strength,
            format="lm-eval",
            output=tmp_path / "steer.pt",
        ).type
        == "result"
    )
    config = torch.load(tmp_path / "steer.pt", weights_only=False)
    hooks = {}
    for hookpoint, info in config.items():  # as lm-eval's SteeredModel builds them from the file
        if info["action"] == "add":
            hooks[hookpoint] = partial(
                hf_steered.SteeredModel.add,
                vector=info["steering_vector"] * info["steering_coefficient"],
                head_index=None,
            )
        else:
            hooks[hookpoint] = partial(
                hf_steered.SteeredModel.clamp,
                direction=info["steering_vector"] / info["steering_vector"].norm(),
                value=info["steering_coefficient"],
                bias=info["bias"],
                head_index=None,
            )
    model = AutoModelForCausalLM.from_pretrained(TOY_DIR, dtype=torch.float32).eval()
    with hf_steered.steer(model, hooks):
        steered = hf_logits(model)
    count = 4
    if mode == "add":
        plan = added(vectors, {2: 0.5 * 2.0})
        assert set(config) == {"layers.2"}
    else:
        where = sites(mode, None, [2], count)
        plan = projecting(vectors, where, Profile(), targets={2: 1.5} if mode == "clamp" else None)
        # a clamp holds the stream after each block; an ablation clamps each block's two writes to 0
        inside = ["layers.{}"] if mode == "clamp" else ["layers.{}.self_attn.o_proj", "layers.{}.mlp.down_proj"]
        assert set(config) == {"embed_tokens", *(point.format(i) for i in range(count) for point in inside)}
    assert close(steered, live_logits(TOY_DIR, plan)) <= EXACT


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        (
            {"mode": "ablate", "format": "llama-cpp"},
            "--format llama-cpp carries add only, not ablate; checkpoint or lora or lm-eval carries it",
        ),
        (
            {"mode": "clamp", "format": "checkpoint"},
            "--format checkpoint carries add and ablate only, not clamp; lm-eval carries it",
        ),
        ({"mode": "add", "format": "lora"}, "--format lora carries ablate only, not add"),
        ({"mode": "ablate", "strength": "0.4x"}, "--strength 0.4x is not a weight"),
    ],
)
def test_a_mode_a_format_cannot_carry_is_refused(tmp_path: Path, fields: dict[str, str], sentence: str) -> None:
    write_artifact(tmp_path / "a.json", TOY_DIR, [2])
    from ster.engine.protocol.errors import Refusal

    with pytest.raises(Refusal, match=sentence):
        build_job_request("bake", model=str(TOY_DIR), vector=tmp_path / "a.json", output=tmp_path / "out", **fields)


def test_bad_outputs_and_another_models_direction_are_refused_with_nothing_written(tmp_path: Path) -> None:
    write_artifact(tmp_path / "a.json", TOY_DIR, [2])
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    refused = bake(model=str(TOY_DIR), vector=tmp_path / "a.json", mode="ablate", output=full)
    assert refused.type == "error" and "already exists and is not empty" in refused.message
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    other = tmp_path / "notes.gguf"
    other.write_text("my notes")
    refused = bake(model=str(TOY_DIR), vector=tmp_path / "a.json", format="llama-cpp", output=other)
    assert refused.type == "error" and "already holds a file that is not a Ster document" in refused.message
    assert other.read_text() == "my notes"
    qwen2, _ = build("qwen2", tmp_path / "qwen2")
    refused = bake(model=str(qwen2), vector=tmp_path / "a.json", mode="ablate", output=tmp_path / "x")
    assert refused.type == "error" and "artifact was trained for model" in refused.message
    assert not (tmp_path / "x").exists()
    partial_weights = bake(
        model=str(TOY_DIR),
        vector=tmp_path / "a.json",
        mode="ablate",
        strength="0.5",
        format="lm-eval",
        output=tmp_path / "s.pt",
    )
    assert partial_weights.type == "error" and "lm-eval's clamp sets the whole component" in partial_weights.message
    assert not (tmp_path / "s.pt").exists()
    assert EMBEDDING == -1
