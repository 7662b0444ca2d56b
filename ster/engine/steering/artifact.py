"""The steering artifact: a versioned JSON document of per-layer unit directions.

It records what a direction needs to be applied honestly: the model identity and
resolved revision, the precision and chat-template decision it was fitted under, the
trait and method, the hidden width, and per layer the direction, its training scores
and ``activation_norm`` (the mean norm of the states it was fitted on, so a strength
can be read against the layer's scale). Loading refuses, in one sentence each, a
document of another product or schema, and — against a model — another model, another
width, a layer the model lacks, or a non-finite value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ster.engine.model.config import LlamaConfig
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error, read_json, write_json
from ster.engine.steering.requests import InspectRequest

if TYPE_CHECKING:
    from ster.engine.protocol.jobs import JobContext

SCHEMA_VERSION = 1


class LayerVector(BaseModel):
    """One layer's direction and what it scored on the pairs it was fitted on."""

    model_config = ConfigDict(extra="forbid")
    layer: int
    vector: list[float]
    train_accuracy: float
    train_margin: float
    activation_norm: float | None = None
    """Mean norm of the residual states at this layer over the fitting pairs (both sides)."""


class SteeringArtifact(BaseModel):
    """The file ``ster train`` and ``ster optimize`` write."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    product: str = "ster"
    model: str
    model_revision: str | None = None
    trait_name: str
    method: str
    hidden_size: int
    precision: str | None = None
    """The dtype the base weights were held at when the direction was fitted (null: not recorded)."""
    chat_template: Literal["applied", "absent", "off"] | None = None
    """How the pairs were encoded when the direction was fitted (null: not recorded)."""
    metadata: dict[str, str] = {}
    vectors: list[LayerVector]

    @field_validator("vectors")
    @classmethod
    def _one_per_layer(cls, vectors: list[LayerVector]) -> list[LayerVector]:
        if not vectors:
            raise ValueError("the artifact holds no vectors")
        layers = [v.layer for v in vectors]
        if len(set(layers)) != len(layers):
            raise ValueError("the artifact holds two vectors for one layer")
        return vectors

    def by_layer(self) -> dict[int, list[float]]:
        return {v.layer: v.vector for v in self.vectors}


class LayerSummary(BaseModel):
    layer: int
    width: int
    norm: float
    """Euclidean length of the direction, summed in f64; 1.0 for anything Ster wrote."""
    train_accuracy: float
    train_margin: float
    activation_norm: float | None


class ArtifactSummary(BaseModel):
    """What ``ster inspect`` prints, and what ``train`` and ``optimize`` print about what they wrote."""

    schema_version: int
    product: str
    model: str
    model_revision: str | None
    trait_name: str
    method: str
    hidden_size: int
    precision: str | None
    chat_template: str | None
    metadata: dict[str, str]
    layers: list[LayerSummary]


def summarize(artifact: SteeringArtifact) -> ArtifactSummary:
    fields = artifact.model_dump(exclude={"vectors"})
    layers = [LayerSummary(layer=v.layer, width=len(v.vector), norm=math.sqrt(math.fsum(x * x for x in v.vector)),
                           train_accuracy=v.train_accuracy, train_margin=v.train_margin,
                           activation_norm=v.activation_norm) for v in artifact.vectors]
    return ArtifactSummary(**fields, layers=layers)


def load_artifact(path: Path) -> SteeringArtifact:
    """Read and check a steering artifact on its own, without a model."""
    raw = read_json(path, "steering artifact")
    if isinstance(raw, dict) and "rank" in raw and "targets" in raw:
        raise Refusal(f"{path} is a LoRA adapter sidecar, not a steering artifact: it carries rank and targets "
                      f"where a steering artifact carries trait_name and vectors")
    if isinstance(raw, dict) and raw.get("product", "ster") != "ster":
        raise Refusal(f'{path} was written by product "{raw["product"]}", not by ster')
    if isinstance(raw, dict) and isinstance(raw.get("schema_version"), int) and raw["schema_version"] != SCHEMA_VERSION:
        raise Refusal(f"{path} has schema version {raw['schema_version']}; this Ster reads version {SCHEMA_VERSION}")
    try:
        artifact = SteeringArtifact.model_validate(raw)
    except ValidationError as exc:
        raise Refusal(f"steering artifact {path} is not in the expected shape: {first_error(exc)}") from None
    _check_values(artifact, path)
    return artifact


def _check_values(artifact: SteeringArtifact, path: Path | str) -> None:
    for entry in artifact.vectors:
        if len(entry.vector) != artifact.hidden_size:
            raise Refusal(f"{path}: layer {entry.layer}'s vector has {len(entry.vector)} values, "
                          f"but the artifact's hidden_size is {artifact.hidden_size}")
        if not all(math.isfinite(x) for x in entry.vector):
            raise Refusal(f"{path}: layer {entry.layer}'s vector holds a non-finite value")


def check_against_model(artifact: SteeringArtifact, model: str, config: LlamaConfig) -> None:
    """Refuse applying the artifact to a model it was not fitted for."""
    if artifact.model != model:
        raise Refusal(f'artifact was trained for model "{artifact.model}", current model is "{model}"')
    if artifact.hidden_size != config.hidden_size:
        raise Refusal(f"artifact width {artifact.hidden_size} does not match model width {config.hidden_size}")
    for entry in artifact.vectors:
        if not 0 <= entry.layer < config.num_hidden_layers:
            raise Refusal(f"artifact has a vector for layer {entry.layer}, but this model has layers "
                          f"0..{config.num_hidden_layers - 1}")


def provenance_warnings(artifact: SteeringArtifact, precision: str, chat_template: str) -> list[str]:
    """The spec's two warnings when a direction is read in a space it was not fitted in; none for null records."""
    return provenance_sentences(artifact.precision, artifact.chat_template, precision, chat_template)


def provenance_sentences(fitted_precision: str | None, fitted_chat: str | None, precision: str,
                         chat_template: str | None) -> list[str]:
    """The warnings for a direction fitted at ``fitted_*`` and read at the run's settings."""
    warnings = []
    if fitted_chat is not None and chat_template is not None and fitted_chat != chat_template:
        warnings.append(f"this direction was trained with chat template {fitted_chat} and this run "
                        f"encodes {chat_template}, so the number below describes a format it was not trained in")
    if fitted_precision is not None and fitted_precision != precision:
        warnings.append(f"this direction was trained at precision {fitted_precision} and this run maps the base "
                        f"weights at {precision}, so it is being read in a different space than it was fitted in")
    return warnings


def save_artifact(path: Path, artifact: SteeringArtifact) -> None:
    """Check values once more and write atomically."""
    _check_values(artifact, path)
    write_json(path, artifact)


def inspect_job(request: InspectRequest, ctx: JobContext) -> ArtifactSummary:
    """Validate and summarise an artifact; no model, no torch."""
    return summarize(load_artifact(request.artifact))
