"""Directions to and from the Python peers: repeng's ``ControlVector`` and steering-vectors' ``SteeringVector``.

Both peers hold what Ster's control-vector import reads (:mod:`ster.engine.steering.control_vector`): per
decoder block, counted from 0, one vector added to that block's output, its strength folded in.

* repeng's ``ControlVector(model_type, directions)``: ``directions[i]`` a NumPy array, added after block ``i``
  by ``ControlModel.set_control(vector, coeff)`` as ``coeff × directions[i]``;
* steering-vectors' ``SteeringVector(layer_activations, layer_type)``: ``layer_activations[i]`` a tensor, added
  after decoder block ``i`` by ``vector.apply(model, multiplier=m)`` as ``m × layer_activations[i]`` (only
  ``layer_type="decoder_block"`` is that).

Reading one is duck-typed, by those attributes, so neither package is imported, or needed, to bring its vectors
in. Writing one builds the peer's own class, and needs that package installed. Ster's artifact goes out as the
vectors ``ster generate`` would add at the given strength (at coefficient or multiplier 1 the peer steers as Ster
does), in ``add`` mode only: the peers have no ablation or clamp of this kind.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from ster.engine.protocol.errors import Refusal
from ster.engine.steering.artifact import SteeringArtifact
from ster.engine.steering.control_vector import ControlVector
from ster.engine.steering.generate import default_strength, scales_for
from ster.engine.steering.strength import Strength

REPENG = "repeng's ControlVector"
STEERING_VECTORS = "steering-vectors' SteeringVector"


def peer_name(vector: Any) -> str:
    """Which peer's object ``vector`` is, by its attributes; refused in one sentence when it is neither."""
    if hasattr(vector, "layer_activations"):
        return STEERING_VECTORS
    if hasattr(vector, "directions") and hasattr(vector, "model_type"):
        return REPENG
    raise Refusal(
        f"expected a repeng ControlVector (directions, model_type) or a steering-vectors SteeringVector "
        f"(layer_activations), got a {type(vector).__name__}"
    )


def vectors_of(vector: Any) -> ControlVector:
    """A peer's vectors as a control vector: block → values, checked (whole block indices, one width, finite)."""
    name = peer_name(vector)
    if name == STEERING_VECTORS:
        layer_type = getattr(vector, "layer_type", "decoder_block")
        if layer_type != "decoder_block":
            raise Refusal(
                f'{name} was recorded at layer_type "{layer_type}"; Ster steers the residual stream after each '
                'decoder block, which is layer_type "decoder_block"'
            )
        items, hint = vector.layer_activations, None
    else:
        items, hint = vector.directions, str(vector.model_type) if vector.model_type else None
    if not isinstance(items, dict) or not items:
        raise Refusal(f"{name} holds no vectors, so it steers nothing")
    layers: dict[int, list[float]] = {}
    for key, values in items.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise Refusal(f"{name} has a vector at {key!r}, which is not a block index (0 or more)")
        layers[key] = _floats(values, f"{name}'s vector for block {key}")
    widths = sorted({len(values) for values in layers.values()})
    if len(widths) > 1:
        raise Refusal(f"{name} holds vectors of widths {widths[0]} and {widths[-1]}; one model has one width")
    return ControlVector(model_hint=hint, layers=dict(sorted(layers.items())), width=widths[0])


def _floats(values: Any, what: str) -> list[float]:
    if hasattr(values, "detach"):  # a tensor, on any device, at any dtype
        values = values.detach().float().cpu().reshape(-1).tolist()
    elif hasattr(values, "tolist"):  # a NumPy array
        values = values.reshape(-1).tolist()
    try:
        found = [float(x) for x in values]
    except (TypeError, ValueError):
        raise Refusal(f"{what} is not a list of numbers") from None
    if not found:
        raise Refusal(f"{what} is empty")
    if not all(math.isfinite(x) for x in found):
        raise Refusal(f"{what} holds a value that is not a finite number")
    return found


def added_vectors(artifact: SteeringArtifact, strength: Strength | None) -> dict[int, list[float]]:
    """Per layer, the vector ``ster generate`` adds there at ``strength`` (None: the strength it takes when given
    none: the artifact's calibrated one, or 1x of an imported vector, or the default)."""
    scales = scales_for(artifact, strength if strength is not None else default_strength("add", artifact)).absolute
    return {layer: [scales[layer] * x for x in values] for layer, values in sorted(artifact.by_layer().items())}


def to_repeng(artifact: SteeringArtifact, strength: Strength | None, model_type: str | None) -> Any:
    """A ``repeng.ControlVector`` that, at coefficient 1, adds what Ster adds at ``strength``."""
    repeng = _peer("repeng", REPENG)
    import numpy as np

    kind = model_type or artifact.metadata.get("model_hint") or _model_type_of(artifact)
    if not kind:
        raise Refusal(
            f"{REPENG} records the model's type (llama, gemma3), and artifact {artifact.trait_name}'s model "
            f"{artifact.model} could not be read to say it; give model_type"
        )
    directions = {
        layer: np.asarray(values, dtype=np.float32) for layer, values in added_vectors(artifact, strength).items()
    }
    return repeng.ControlVector(model_type=kind, directions=directions)


def to_steering_vectors(artifact: SteeringArtifact, strength: Strength | None) -> Any:
    """A ``steering_vectors.SteeringVector`` that, at multiplier 1, adds what Ster adds at ``strength``."""
    peer = _peer("steering_vectors", STEERING_VECTORS)
    import torch

    activations = {
        layer: torch.tensor(values, dtype=torch.float32) for layer, values in added_vectors(artifact, strength).items()
    }
    return peer.SteeringVector(layer_activations=activations, layer_type="decoder_block")


def _model_type_of(artifact: SteeringArtifact) -> str | None:
    """The ``model_type`` in the config.json of the model the artifact was fitted on, where it is at hand (a local
    directory, the bundled toy, the Hub's cache); None where it is not."""
    from pathlib import Path

    from ster.engine.model.config import read_model_type
    from ster.engine.model.resolve import RESERVED, resolve_model

    try:
        if artifact.model in RESERVED or Path(artifact.model).expanduser().is_dir():
            return read_model_type(resolve_model(artifact.model, artifact.model_revision).config)
        from huggingface_hub import try_to_load_from_cache  # a Hub id: its cached config, never a download

        cached = try_to_load_from_cache(artifact.model, "config.json", revision=artifact.model_revision)
        return read_model_type(Path(cached)) if isinstance(cached, str) else None
    except (Refusal, ValueError, OSError):
        return None


def _peer(module: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.replace("_", "-")
        raise Refusal(
            f"making {name} needs the {package} package, which could not be imported ({exc}); pip install {package}"
        ) from None
