"""A request's steering spec resolved against a served model: artifacts read, strengths and plans worked out.

Everything that can be wrong with a spec is found here, before a row joins the batch: an artifact that
cannot be read or was fitted on another model, a layer it has no direction for, ``"calibrated"`` for an
artifact nobody calibrated. Each is a :class:`~ster.engine.protocol.errors.Refusal` naming the field. The
rules are ``ster generate``'s, through the same functions (:func:`~ster.engine.steering.generate.row_plan`,
:func:`~ster.engine.steering.generate.left_out_strength`), so a served row steers exactly as the command
does. The :class:`Registry` holds vectors and adapters registered by name while the server runs; a row keeps
the artifact it resolved, so replacing a name never changes a running request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ster.engine.model.loading import Checkpoint
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.serving.spec import Condition, Intervention, SteeringSpec
from ster.engine.steering.artifact import SteeringArtifact, check_against_model, load_artifact
from ster.engine.steering.generate import as_calibrated, calibrated_strength, default_strength, row_plan
from ster.engine.steering.requests import InterventionFields
from ster.engine.steering.strength import Strength

Kind = Literal["vector", "adapter"]


class SpecRefusal(Refusal):
    """A steering spec refused, with the field it names (``steering[0].scale``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Registered:
    """A name registered while the server runs: a steering artifact (read once, kept) or an adapter's path."""

    name: str
    kind: Kind
    path: str
    artifact: SteeringArtifact | None = None

    def shown(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": self.name, "kind": self.kind, "path": self.path}
        if self.artifact is not None:
            shown |= {
                "model": self.artifact.model,
                "trait_name": self.artifact.trait_name,
                "method": self.artifact.method,
                "layers": [v.layer for v in self.artifact.vectors],
                "calibrated": self.artifact.calibration is not None,
            }
        return shown


class Registry:
    """Named vectors and adapters, replaced or removed at any time; readers get a consistent entry."""

    def __init__(self) -> None:
        self._entries: dict[str, Registered] = {}
        self._lock = threading.Lock()

    def put(self, entry: Registered) -> bool:
        """Register or replace; True when it replaced an entry."""
        with self._lock:
            replaced = entry.name in self._entries
            self._entries[entry.name] = entry
            return replaced

    def get(self, name: str) -> Registered | None:
        with self._lock:
            return self._entries.get(name)

    def remove(self, name: str) -> Registered | None:
        with self._lock:
            return self._entries.pop(name, None)

    def listed(self) -> list[Registered]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda entry: entry.name)


@dataclass(frozen=True)
class Resolved:
    """One intervention resolved: what the batcher runs, and what the response says it did."""

    row: Any
    """A :class:`~ster.engine.serving.batcher.RowIntervention` (imported with torch, by the caller)."""
    shown: dict[str, Any]


def artifact_reader(registry: Registry, read: Callable[[str], Path]) -> Callable[[str, str], SteeringArtifact]:
    """``(name, param) -> artifact``: a registered vector by name, else a path (through ``read``, which confines it
    under the server's root and refuses it in one sentence)."""

    def artifact(name: str, param: str) -> SteeringArtifact:
        entry = registry.get(name)
        if entry is not None:
            if entry.kind != "vector" or entry.artifact is None:
                raise SpecRefusal(
                    f"{param} names {name}, which is registered as an adapter, not a steering vector", param
                )
            return entry.artifact
        try:
            return load_artifact(read(name))
        except SpecRefusal:
            raise
        except Refusal as exc:
            raise SpecRefusal(str(exc), param) from None

    return artifact


def resolve(
    spec: SteeringSpec,
    checkpoint: Checkpoint,
    artifact: Callable[[str, str], SteeringArtifact],
    ctx: JobContext,
) -> list[Resolved]:
    """Every intervention of ``spec`` with its artifact checked against the model, its strength and its plan."""
    from ster.engine.serving.batcher import RowCondition, RowIntervention  # torch: a model is loaded by now

    config = checkpoint.config
    out = []
    for index, each in enumerate(spec.interventions):
        param = f"steering[{index}]"
        found = artifact(each.vector, f"{param}.vector")
        _fits_model(found, checkpoint, f"{param}.vector", each.vector)
        given = {name: value for name, value in each.fields().items() if _given(each, name)}
        try:
            fields = as_calibrated(InterventionFields.model_validate(given), found, ctx)
            strength = _strength(each, found, fields, f"{param}.scale")
            plan = row_plan(found, fields, strength, config.num_hidden_layers, ctx)
        except SpecRefusal:
            raise
        except Refusal as exc:
            raise SpecRefusal(f"{param}: {exc}", param) from None
        condition = None
        if each.condition is not None:
            rule = each.condition
            layer, direction = _condition(rule, artifact, checkpoint, f"{param}.condition")
            condition = RowCondition(layer, tuple(direction), rule.measure, rule.aggregate, rule.passes)
        row = RowIntervention(
            plan=plan,
            prompt=each.apply_to in ("both", "prompt"),
            positions=None if each.prefill_trigger_positions is None else tuple(each.prefill_trigger_positions),
            generation=each.apply_to in ("both", "generation"),
            first_k=each.generate_first_k_tokens,
            after_k=each.generate_after_k_tokens,
            condition=condition,
        )
        shown = {
            "vector": each.vector,
            "mode": fields.mode,
            "scale": str(strength),
            "sites": sorted(plan),
            "apply_to": each.apply_to,
        }
        out.append(Resolved(row, shown))
    return out


def _given(each: Intervention, name: str) -> bool:
    aliases = {"layers": "target_layers"}
    return aliases.get(name, name) in each.model_fields_set


def _fits_model(found: SteeringArtifact, checkpoint: Checkpoint, param: str, name: str) -> None:
    config = checkpoint.config
    try:
        check_against_model(
            found, checkpoint.source.model, checkpoint.fingerprint, config.hidden_size, config.num_hidden_layers
        )
    except Refusal as exc:
        raise SpecRefusal(f"{param} {name}: {exc}", param) from None


def _strength(each: Intervention, found: SteeringArtifact, fields: InterventionFields, param: str) -> Strength:
    if each.scale == "calibrated":
        calibrated = calibrated_strength(found, 1)
        if calibrated is None:
            raise SpecRefusal(
                f'{param} is "calibrated", but {each.vector} holds no calibrated strength; run ster calibrate on it, '
                "or give a number",
                param,
            )
        return calibrated
    if each.scale is not None:
        return Strength.model_validate(each.scale)
    return default_strength(fields.mode, found)


def _condition(
    condition: Condition, artifact: Callable[[str, str], SteeringArtifact], checkpoint: Checkpoint, param: str
) -> tuple[int, list[float]]:
    found = artifact(condition.vector, f"{param}.vector")
    _fits_model(found, checkpoint, f"{param}.vector", condition.vector)
    directions = found.by_layer()
    layer = min(directions) if condition.layer is None else condition.layer
    if layer not in directions:
        raise SpecRefusal(
            f"{param}.layer {layer} names a layer {condition.vector} has no direction for "
            f"(it has layers {', '.join(map(str, sorted(directions)))})",
            f"{param}.layer",
        )
    return layer, directions[layer]
