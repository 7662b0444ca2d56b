"""Strengths relative to each layer's activation norm (``0.4x``) against absolute ones (``3``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from ster.engine.protocol.errors import Refusal
from ster.engine.steering.requests import SweepRequest
from ster.engine.steering.strength import Strength

PROMPT = "question : tell me about the town . answer :"


@pytest.mark.parametrize(
    ("raw", "value", "unit"),
    [
        (3, 3.0, "absolute"),
        ("3", 3.0, "absolute"),
        ("-0.4x", -0.4, "relative"),
        (" 0.5X ", 0.5, "relative"),
        ({"value": 2, "unit": "relative"}, 2.0, "relative"),
    ],
)
def test_one_spelling_for_both_units(raw: object, value: float, unit: str) -> None:
    strength = Strength.model_validate(raw)
    assert (strength.value, strength.unit) == (value, unit)
    assert Strength.model_validate(str(strength)) == strength


@pytest.mark.parametrize("raw", ["abc", "x", "nanx", "inf", "1e400x", True, "0.4xx"])
def test_anything_else_is_refused(raw: object) -> None:
    with pytest.raises(ValidationError):
        Strength.model_validate(raw)


def test_relative_strength_scales_each_layer_by_its_own_norm() -> None:
    strength = Strength.model_validate("0.5x")
    assert strength.per_layer({2: 10.0, 5: 40.0}) == {2: 5.0, 5: 20.0}
    assert strength.relative_per_layer({2: 10.0, 5: 40.0}) == {2: 0.5, 5: 0.5}
    assert Strength.model_validate(3).relative_per_layer({2: 10.0, 5: None}) == {2: 0.3}


def test_relative_strength_needs_the_norm() -> None:
    with pytest.raises(Refusal, match="records no activation_norm for layer 5"):
        Strength.model_validate("0.5x").per_layer({2: 10.0, 5: None})


def test_a_sweep_takes_one_unit_and_always_includes_zero() -> None:
    fields = {"model": "ster:toy", "vector": "v.json", "prompts": "p.json"}
    sweep = SweepRequest.model_validate({**fields, "strengths": "0.4x,-0.4x"})
    assert [str(s) for s in sweep.strengths] == ["-0.4x", "0x", "0.4x"]
    with pytest.raises(ValidationError, match="mixes absolute and relative"):
        SweepRequest.model_validate({**fields, "strengths": "0.4x,3"})


def test_a_relative_strength_scales_each_layer_by_its_spread_and_0x_is_the_baseline(cli, tmp_path: Path) -> None:
    vector = tmp_path / "calm.json"
    assert (
        cli(
            "train",
            "--model",
            "ster:toy",
            "--pairs",
            "ster/data/examples/pairs.json",
            "--output",
            vector,
            "--layers",
            "2,3",
        ).code
        == 0
    )
    document = json.loads(vector.read_text())
    assert document["strength_unit"] == "spread"
    spreads = {v["layer"]: v["activation_spread"] for v in document["vectors"]}
    norms = {v["layer"]: v["activation_norm"] for v in document["vectors"]}
    assert spreads[2] != spreads[3]
    relative = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", vector, "--strength", "0.3x").json
    assert relative["strength_unit"] == "relative"
    assert relative["absolute_strength"] == {str(k): pytest.approx(0.3 * s) for k, s in spreads.items()}
    assert relative["relative_strength"] == {str(k): pytest.approx(0.3 * spreads[k] / n) for k, n in norms.items()}
    base = cli("generate", "--model", "ster:toy", "--prompt", PROMPT).json["text"]
    assert relative["text"] != base
    assert (
        cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", vector, "--strength", "0x").json["text"]
        == base
    )
