"""The steering artifact: a versioned JSON document of per-layer unit directions.

It records what a direction needs to be applied honestly: the model identity and
resolved revision, the precision and chat-template decision it was fitted under, the
trait and method, the hidden width, and per layer the direction, its training scores
and ``activation_norm`` (the mean norm of the states it was fitted on, so a strength
can be read against the layer's scale). Loading refuses, in one sentence each, a
document of another product or schema, a non-finite value, and a direction that is not
unit length (Ster writes nothing else, so one is a file written or edited elsewhere);
against a model it refuses another model, another width, or a layer the model lacks.

A model is identified by what it is: the artifact records the checkpoint's fingerprint
(:mod:`ster.engine.model.fingerprint`) beside the ``--model`` string. A matching
fingerprint is accepted under any name (said in a log line); a different fingerprint is
refused whatever the name, because the weights the direction was fitted on are not the
ones at hand — including when the checkpoint at the recorded path has changed. An
artifact without a fingerprint (written before it was recorded) is matched by name.
Per-layer vectors are read under ``vector`` or ``values`` (the original's key).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from ster.engine.model.adapters.artifact import sidecar_path
from ster.engine.model.config import MAX_LAYERS
from ster.engine.model.provenance import check_identity, provenance_warnings
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error, read_json, write_json
from ster.engine.protocol.kinds import ADAPTER_SIDECAR, file_kind
from ster.engine.steering.calibration_record import Calibration
from ster.engine.steering.requests import EvaluateRequest, GenerateRequest, InspectRequest, SweepRequest

if TYPE_CHECKING:
    from ster.engine.model.loading import Checkpoint
    from ster.engine.protocol.jobs import JobContext

SCHEMA_VERSION = 1
UNIT_TOLERANCE = 1e-3
"""A direction whose norm is further than this from 1 was not written by Ster (whose norms are 1 to 1e-7)."""
GENERIC_CONSEQUENCE = "so it would read and steer text in a format it was not trained in"
"""How the chat-template warning ends where no command is named (the TUI, loading an artifact)."""


class LayerVector(BaseModel):
    """One layer's direction and what it scored on the pairs it was fitted on.

    The direction is written under the original's key ``values`` (so Ster 0.13 reads what this Ster writes) and
    read under ``values`` or ``vector`` (what this Ster wrote before)."""

    model_config = ConfigDict(extra="forbid")
    layer: int
    vector: list[float]
    train_accuracy: float | None = None
    """What the direction scored on the pairs it was fitted on; null for one not fitted on pairs (imported)."""
    train_margin: float | None = None
    activation_norm: float | None = None
    """Mean norm of the residual states at this layer over the fitting pairs (both sides); null where not
    recorded."""
    activation_spread: float | None = None
    """RMS spread of the states at this layer about their mean, over every position of the fitting texts but
    each text's first (see :class:`ster.engine.steering.activations.Spread`); absent from older files."""
    vector_norm: float | None = None
    """The length the direction had where it came from (an imported control vector, its strength folded in):
    with ``strength_unit: "vector"``, ``1x`` adds the vector as it was. Absent from fitted directions."""

    @model_validator(mode="before")
    @classmethod
    def _values_key(cls, raw: Any) -> Any:
        """Read the original's ``values`` as ``vector``; refuse a layer that carries both."""
        if not isinstance(raw, dict) or "values" not in raw:
            return raw
        if "vector" in raw:
            raise ValueError("a layer carries both vector and values (two names for one list); keep one")
        return {("vector" if key == "values" else key): value for key, value in raw.items()}

    @model_serializer(mode="wrap")
    def _written_as_values(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("vector_norm") is None:  # a fitted direction is written as it always was
            data.pop("vector_norm", None)
        return {("values" if key == "vector" else key): value for key, value in data.items()}


class SteeringArtifact(BaseModel):
    """The file ``ster train`` and ``ster optimize`` write."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    product: str = "ster"
    model: str
    model_revision: str | None = None
    model_fingerprint: str | None = None
    """What the checkpoint was (see :mod:`ster.engine.model.fingerprint`); null in older files."""
    trait_name: str
    method: Literal["caa", "pca", "logistic", "imported"]
    """How the direction was fitted; ``imported`` for one read from another tool's file (``ster vector import``)."""
    hidden_size: int
    precision: Literal["f32", "f16", "bf16", "int8"] | None = None
    """The dtype the base weights were held at when the direction was fitted (null: not recorded)."""
    chat_template: Literal["applied", "absent", "off"] | None = None
    """How the pairs were encoded when the direction was fitted (null: not recorded)."""
    adapter: str | None = None
    """The LoRA adapter the pairs were read through, as given to ``--adapter``; absent from the file when none."""
    metadata: dict[str, str] = {}
    vectors: list[LayerVector]
    calibration: Calibration | None = None
    """What ``ster calibrate`` chose and measured; absent from the file for an uncalibrated direction."""
    strength_unit: Literal["norm", "spread", "vector"] | None = None
    """What a relative strength (``0.4x``) multiplies at each layer: ``spread`` (``activation_spread``),
    ``vector`` (``vector_norm``: an imported vector as it was), or ``norm`` (``activation_norm``), which is
    also what a file without the field means."""

    @model_serializer(mode="wrap")
    def _no_adapter_no_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A direction fitted on the bare checkpoint, or not calibrated, is written exactly as before."""
        data: dict[str, Any] = handler(self)
        for key in ("adapter", "calibration", "strength_unit"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @field_validator("model_revision", "model_fingerprint", "adapter", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        """A blank record means none, as everywhere (an adapter of "" is the bare checkpoint)."""
        return None if isinstance(value, str) and not value.strip() else value

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

    @property
    def unit(self) -> str:
        """The quantity a relative strength multiplies: ``activation_spread`` or ``activation_norm``."""
        return {"spread": "activation_spread", "vector": "vector_norm"}.get(self.strength_unit or "", "activation_norm")

    def unit_scales(self) -> dict[int, float | None]:
        """Per layer, what ``1x`` is in the residual stream's units (None where the artifact records none)."""
        return {v.layer: getattr(v, self.unit) for v in self.vectors}


class LayerSummary(BaseModel):
    layer: int
    width: int
    norm: float
    """Euclidean length of the direction, summed in f64; 1.0 for anything Ster wrote."""
    train_accuracy: float | None
    train_margin: float | None
    activation_norm: float | None
    activation_spread: float | None = None
    vector_norm: float | None = None


class ArtifactSummary(BaseModel):
    """What ``ster inspect`` prints, and what ``train`` and ``optimize`` print about what they wrote."""

    schema_version: int
    product: str
    model: str
    model_revision: str | None
    model_fingerprint: str | None
    trait_name: str
    method: str
    hidden_size: int
    precision: str | None
    chat_template: str | None
    adapter: str | None = None
    """The LoRA adapter the direction was fitted through, or null for the bare checkpoint."""
    metadata: dict[str, str]
    layers: list[LayerSummary]
    calibration: Calibration | None = None
    """What ``ster calibrate`` chose and measured (null for an uncalibrated direction)."""
    strength_unit: str = "norm"
    """What a relative strength multiplies: each layer's ``activation_spread`` or ``activation_norm``."""


def summarize(artifact: SteeringArtifact) -> ArtifactSummary:
    fields = artifact.model_dump(exclude={"vectors"})
    fields["strength_unit"] = artifact.strength_unit or "norm"
    layers = [
        LayerSummary(
            layer=v.layer,
            width=len(v.vector),
            norm=_norm(v.vector),
            train_accuracy=v.train_accuracy,
            train_margin=v.train_margin,
            activation_norm=v.activation_norm,
            activation_spread=v.activation_spread,
            vector_norm=v.vector_norm,
        )
        for v in artifact.vectors
    ]
    return ArtifactSummary(**fields, layers=layers)


def load_artifact(path: Path) -> SteeringArtifact:
    """Read and check a steering artifact on its own, without a model."""
    _not_an_adapter_file(path)
    raw = read_json(path, "steering artifact")
    if isinstance(raw, dict) and "rank" in raw and "targets" in raw:
        raise Refusal(
            f"{path} is a LoRA adapter sidecar, not a steering artifact: it carries rank and targets "
            f"where a steering artifact carries trait_name and vectors"
        )
    if isinstance(raw, dict) and raw.get("product", "ster") != "ster":
        raise Refusal(f'{path} was written by product "{raw["product"]}", not by ster')
    if isinstance(raw, dict) and isinstance(raw.get("schema_version"), int) and raw["schema_version"] != SCHEMA_VERSION:
        raise Refusal(f"{path} has schema version {raw['schema_version']}; this Ster reads version {SCHEMA_VERSION}")
    try:
        artifact = SteeringArtifact.model_validate(raw, strict=True)  # a layer of "3" or true is not a layer
    except ValidationError as exc:
        raise Refusal(f"steering artifact {path} is not in the expected shape: {first_error(exc)}") from None
    _check_values(artifact, path)
    return artifact


def _not_an_adapter_file(path: Path) -> None:
    """Refuse an adapter's safetensors file by the cross-document sentence: its sidecar beside it says what it is."""
    side = sidecar_path(path)
    real, real_side = confine.readable(path), confine.readable(side)
    if side != path and real.is_file() and real_side.is_file() and file_kind(real_side) == ADAPTER_SIDECAR:
        raise Refusal(
            f"{path} is a LoRA adapter, not a steering artifact: its sidecar {side} carries rank and targets "
            f"where a steering artifact carries trait_name and vectors"
        )


def _check_values(artifact: SteeringArtifact, path: Path | str) -> None:
    """Refuse every value no fitted direction can have, in one sentence naming the field (before a model loads)."""
    if not artifact.model.strip():
        raise Refusal(f"{path} names no model, so nothing can say which model the direction was fitted on")
    if artifact.hidden_size < 1:
        raise Refusal(f"{path}: hidden_size {artifact.hidden_size} is not a width; it must be at least 1")
    for entry in artifact.vectors:
        _check_layer(entry, path)
        _check_direction(entry, artifact.hidden_size, path)
        _check_scores(entry, path)
    if artifact.calibration is not None:
        _check_calibration(artifact.calibration, path)


def _check_calibration(calibration: Calibration, path: Path | str) -> None:
    """A calibrated strength is finite and of its sign, and a budget and a KL are numbers of at least 0."""
    if not (math.isfinite(calibration.kl_budget) and calibration.kl_budget > 0):
        raise Refusal(f"{path}: calibration.kl_budget {calibration.kl_budget} is not a budget; it must be above 0")
    for sign, side in (("positive", calibration.positive), ("negative", calibration.negative)):
        if side is None:
            continue
        if not math.isfinite(side.strength) or side.strength * (1 if sign == "positive" else -1) <= 0:
            raise Refusal(f"{path}: calibration.{sign}.strength {side.strength} is not a {sign} finite strength")
        if not (math.isfinite(side.kl) and side.kl >= 0):
            raise Refusal(f"{path}: calibration.{sign}.kl {side.kl} is not a KL divergence; it must be at least 0")


def _check_layer(entry: LayerVector, path: Path | str) -> None:
    if entry.layer < 0:
        raise Refusal(f"{path}: layer {entry.layer} is not a layer index; layers are numbered from 0")
    if entry.layer >= MAX_LAYERS:
        raise Refusal(
            f"{path}: layer {entry.layer} is beyond any model's layers (Ster reads models of at most "
            f"{MAX_LAYERS} layers)"
        )


def _check_scores(entry: LayerVector, path: Path | str) -> None:
    """The scores the direction was fitted with: an accuracy in [0, 1], a finite margin, a positive norm."""
    where = f"{path}: layer {entry.layer}'s"
    accuracy, margin = entry.train_accuracy, entry.train_margin
    if accuracy is not None and not (math.isfinite(accuracy) and 0 <= accuracy <= 1):
        raise Refusal(f"{where} train_accuracy is {accuracy}; an accuracy lies between 0 and 1")
    if margin is not None and not math.isfinite(margin):
        raise Refusal(f"{where} train_margin is {margin}; a margin is a finite number")
    length = entry.vector_norm
    if length is not None and not (math.isfinite(length) and length > 0):
        raise Refusal(f"{where} vector_norm is {length}; it is a length, a finite number above 0")
    norm = entry.activation_norm
    if norm is not None and not (math.isfinite(norm) and norm > 0):
        raise Refusal(
            f"{where} activation_norm is {norm}; it is the mean norm of the states the direction was "
            "fitted on, a finite number above 0 (or null where it was not recorded)"
        )
    spread = entry.activation_spread
    if spread is not None and not (math.isfinite(spread) and spread > 0):
        raise Refusal(
            f"{where} activation_spread is {spread}; it is the spread of the states the direction was "
            "fitted on, a finite number above 0 (or null where it was not recorded)"
        )


def _check_direction(entry: LayerVector, hidden_size: int, path: Path | str) -> None:
    """A direction of the artifact's width, finite, and of unit length (what Ster writes)."""
    where = f"{path}: layer {entry.layer}'s vector"
    if len(entry.vector) != hidden_size:
        raise Refusal(f"{where} has {len(entry.vector)} values, but the artifact's hidden_size is {hidden_size}")
    if not all(math.isfinite(x) for x in entry.vector):
        raise Refusal(f"{where} holds a non-finite value")
    norm = _norm(entry.vector)
    if norm == 0:
        raise Refusal(f"{where} is all zeros, so it has no direction to steer along")
    if abs(norm - 1) > UNIT_TOLERANCE:
        raise Refusal(
            f"{where} has norm {norm:.6g} where Ster writes unit directions, so it was written or edited elsewhere"
        )


def _norm(vector: list[float]) -> float:
    """Euclidean length in f64 without overflow (1e200 components give a finite norm, not inf)."""
    return math.hypot(*vector)


def check_against_model(
    artifact: SteeringArtifact, model: str, fingerprint: str, hidden_size: int, layers: int
) -> str | None:
    """Refuse applying the artifact to a model it was not fitted for; the log line when only its
    fingerprint, not its name, says it is the same model."""
    note = check_identity(
        "artifact", artifact.model, artifact.model_fingerprint, model, fingerprint, "the direction was fitted"
    )
    if artifact.hidden_size != hidden_size:
        raise Refusal(f"artifact width {artifact.hidden_size} does not match model width {hidden_size}")
    for entry in artifact.vectors:
        if not 0 <= entry.layer < layers:
            raise Refusal(f"artifact has a vector for layer {entry.layer}, but this model has layers 0..{layers - 1}")
    return note


def open_artifact(ctx: JobContext, path: Path, checkpoint: Checkpoint) -> SteeringArtifact:
    """Load an artifact, refuse it for another model, and warn when it is read out of its format."""
    artifact = load_artifact(path)
    config = checkpoint.config
    note = check_against_model(
        artifact, checkpoint.source.model, checkpoint.fingerprint, config.hidden_size, config.num_hidden_layers
    )
    if note is not None:
        ctx.log(note)
    for sentence in provenance_sentences(
        artifact.precision,
        artifact.chat_template,
        checkpoint.request.precision,
        checkpoint.codec.decision,
        _consequence(checkpoint.request),
    ):
        ctx.warn(sentence)
    adapted = adapter_sentence(artifact.adapter, getattr(checkpoint.request, "adapter", None))
    if adapted:
        ctx.warn(adapted)
    return artifact


def adapter_sentence(fitted: str | None, current: Path | None) -> str | None:
    """The warning for a direction read through another adapter than it was fitted through (or none where it had
    one); adapters are told apart by file name, so the same adapter reached by another path is not warned about."""
    if fitted is None and current is None:
        return None
    if fitted is not None and current is not None and Path(fitted).name == current.name:
        return None
    was = f"through adapter {fitted}" if fitted else "on the bare checkpoint"
    now = f"attaches adapter {current}" if current else "reads the bare checkpoint"
    return (
        f"this direction was fitted {was} and this run {now}, so it is being read in a different space than "
        f"it was fitted in"
    )


def _consequence(request: object) -> str:
    """What a chat-template mismatch means for the command that reads the artifact."""
    if isinstance(request, EvaluateRequest):
        return "so the accuracy and margin below describe a format it was not trained in"
    if isinstance(request, SweepRequest):
        return "so this sweep steers, and measures its effect, in a format it was not trained in"
    if isinstance(request, GenerateRequest):
        return "so it steers a prompt encoded in a format it was not trained in"
    return GENERIC_CONSEQUENCE


def provenance_sentences(
    fitted_precision: str | None,
    fitted_chat: str | None,
    precision: str,
    chat_template: str | None,
    consequence: str = GENERIC_CONSEQUENCE,
) -> list[str]:
    """The warnings for a direction fitted at ``fitted_*`` and read at the run's settings; none for null
    records. ``consequence`` ends the chat-template sentence with what the mismatch means here."""
    return provenance_warnings("direction", fitted_precision, fitted_chat, precision, chat_template, consequence)


def save_artifact(path: Path, artifact: SteeringArtifact) -> None:
    """Check values once more and write atomically."""
    _check_values(artifact, path)
    write_json(path, artifact)


def inspect_job(request: InspectRequest, ctx: JobContext) -> ArtifactSummary:
    """Validate and summarise an artifact; no model, no torch."""
    return summarize(load_artifact(request.artifact))
