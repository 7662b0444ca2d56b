"""Directions to and from repeng and steering-vectors, checked against the peers' own code steering transformers'
model: converted out, the peer steers as Ster does; brought in, Ster steers as the peer did."""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ster
from tests.api.conftest import hooks_on

IDS = torch.tensor([[1, 17, 5, 29, 8, 41, 3, 12]])


@pytest.fixture
def repeng(monkeypatch: pytest.MonkeyPatch) -> Any:
    """repeng 0.4.0 itself; it names ``np.float_`` in its annotations, which NumPy 2 removed, so the test lends it
    the alias it meant (the conversion itself never imports repeng but to build its object)."""
    if not hasattr(np, "float_"):
        monkeypatch.setattr(np, "float_", np.float64, raising=False)
    return pytest.importorskip("repeng")


@pytest.fixture
def steering_vectors() -> Any:
    return pytest.importorskip("steering_vectors")


def logits(model: Any) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits


def test_steering_vectors_steers_as_ster_does_with_the_converted_vector(
    hf_toy: Any, fitted: Path, steering_vectors: Any
) -> None:
    vector = ster.to_steering_vectors(fitted, strength="0.8x")
    assert isinstance(vector, steering_vectors.SteeringVector) and vector.layer_type == "decoder_block"
    with ster.steer(hf_toy, fitted, strength="0.8x"):
        ours = logits(hf_toy)
    with vector.apply(hf_toy):
        theirs = logits(hf_toy)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    default = ster.to_steering_vectors(fitted)  # the strength ster generate takes when given none: 0.4x
    half = {layer: values / 2 for layer, values in vector.layer_activations.items()}
    assert all(torch.allclose(default.layer_activations[k], half[k], atol=1e-6) for k in half)


def test_repeng_steers_as_ster_does_with_the_converted_vector(hf_toy: Any, fitted: Path, repeng: Any) -> None:
    with ster.steer(hf_toy, fitted, strength="-0.6x"):
        ours = logits(hf_toy)
    vector = ster.to_repeng(fitted, strength="-0.6x", model_type="llama")
    assert isinstance(vector, repeng.ControlVector) and sorted(vector.directions) == [0, 1, 2, 3]
    controlled = repeng.ControlModel(hf_toy, list(vector.directions))
    controlled.set_control(vector, 1.0)
    theirs = logits(controlled)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    assert ster.to_repeng(fitted).model_type == "llama"  # read off the config.json of the model it was fitted on
    elsewhere = ster.load_artifact(fitted).model_copy(update={"model": "acme/not-cached"})
    with pytest.raises(ster.SterError, match="acme/not-cached could not be read to say it; give model_type$"):
        ster.to_repeng(elsewhere)


def test_a_peers_vector_brought_in_steers_as_the_peer_did(hf_toy: Any, steering_vectors: Any, tmp_path: Path) -> None:
    torch.manual_seed(1)
    theirs = steering_vectors.SteeringVector({1: torch.randn(64), 3: torch.randn(64) * 2})
    with pytest.warns(ster.SterWarning, match="records no fingerprint"):
        artifact = ster.from_peer(theirs, "ster:toy", trait_name="random")
    assert artifact.method == "imported" and artifact.strength_unit == "vector" and artifact.trait_name == "random"
    assert artifact.metadata["imported_from"] == "steering-vectors' SteeringVector"
    with theirs.apply(hf_toy, multiplier=0.5):
        expected = logits(hf_toy)
    with ster.steer(hf_toy, artifact, strength="0.5x"):  # 0.5 of the vector as it was
        ours = logits(hf_toy)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    back = ster.to_steering_vectors(artifact)  # 1x: the vectors as they came
    assert all(torch.allclose(back.layer_activations[k], v, atol=1e-5) for k, v in theirs.layer_activations.items())
    assert hooks_on(hf_toy) == 0


def test_a_repeng_vector_brought_in_through_an_opened_model_is_written_as_an_artifact(
    repeng: Any, tmp_path: Path
) -> None:
    toy = ster.open("ster:toy", progress=False)
    vector = repeng.ControlVector(model_type="llama", directions={2: np.full(64, 0.25, dtype=np.float32)})
    out = tmp_path / "repeng.json"
    with pytest.warns(ster.SterWarning):
        summary = toy.import_vector(vector, out, trait_name="flat")
    written = json.loads(out.read_text())
    assert written["trait_name"] == "flat" and written["metadata"]["model_hint"] == "llama"
    assert [layer["layer"] for layer in written["vectors"]] == [2] and summary.layers[0].vector_norm == pytest.approx(2)
    back = ster.to_repeng(out)  # the hint it came with is its model type
    assert back.model_type == "llama" and np.allclose(back.directions[2], 0.25)
    steered = toy.generate("Hello", max_new_tokens=6, vector=out)
    assert steered.strength == 1.0 and steered.strength_unit == "relative"


@dataclass
class Lookalike:
    """An object shaped as steering-vectors' SteeringVector, as read without the package."""

    layer_activations: dict[Any, Any]
    layer_type: str = "decoder_block"


def test_objects_the_peers_would_not_steer_with_are_refused_in_one_sentence(tmp_path: Path) -> None:
    cases = [
        (Lookalike({0: torch.ones(32)}), "is 32 wide, and ster:toy's residual stream is 64"),
        (Lookalike({9: torch.ones(64)}), "holds a direction for block 9, and ster:toy has blocks 0..3"),
        (Lookalike({0: torch.ones(64)}, "attention"), 'layer_type "attention"'),
        (Lookalike({-1: torch.ones(64)}), "-1, which is not a block index"),
        (Lookalike({0: torch.ones(64), 1: torch.ones(8)}), "widths 8 and 64"),
        (Lookalike({0: torch.tensor([float("nan")] * 64)}), "not a finite number"),
        (Lookalike({}), "holds no vectors"),
        ({"directions": 1}, "expected a repeng ControlVector"),
    ]
    for vector, sentence in cases:
        with pytest.raises(ster.SterError) as raised, warnings.catch_warnings():
            warnings.simplefilter("ignore", ster.SterWarning)
            ster.from_peer(vector, "ster:toy")
        assert sentence in str(raised.value), str(raised.value)
    assert not list(tmp_path.iterdir())


def test_making_a_peers_object_without_the_peer_installed_says_how_to_get_it(
    fitted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "steering_vectors", None)  # import fails as for a package not installed
    with pytest.raises(ster.SterError, match="pip install steering-vectors$"):
        ster.to_steering_vectors(fitted)
