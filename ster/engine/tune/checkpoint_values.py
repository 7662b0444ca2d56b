"""A checkpoint judged wholly before a value of it is used: every field, every tensor, against the run resuming it.

A resumed run trusts nothing it reads. In two steps, each refusing in one sentence that names the defect:

* :func:`read_saved` and :func:`check_contents`, without torch and without the model: the file's
  bytes against its header (:mod:`ster.engine.protocol.tensorfile`), exactly the three metadata
  documents Ster writes, the loop's fields with their types (a step of ``"4"`` or ``-1`` is no
  step), every number finite, the reference scores, and every tensor: a name Ster writes, F32,
  finite, AdamW's second moments not negative, each tensor's step count equal to the loop's, its
  three moments together, and factors no larger than an adapter may hold
  (:data:`~ster.engine.model.adapters.file.LIMIT`);
* :func:`check_fits`, once the run has drawn its adapter and built its loop: the same tensors with
  the same shapes, optimizer state for exactly the trained tensors, a step within the run's steps,
  as many per-unit numbers and history entries as that step implies, the numbers the objective
  reads, and a reference score for exactly the pairs it trains on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ster.engine.model.adapters.artifact import REWARD_HEAD, TARGETS
from ster.engine.model.adapters.file import check_factors, check_largest
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import DuplicateKey, unique_keys
from ster.engine.protocol.inputs import read_input
from ster.engine.protocol.naming import flag
from ster.engine.protocol.tensorfile import Damaged, TensorFile, parse

METADATA = ("identity", "loop", "reference")
LOOP = {
    "step": int,
    "first_loss": float,
    "final_loss": float,
    "epoch_stats": list,
    "epoch_history": list,
    "tokens": int,
    "seconds": float,
}
"""The loop's fields (:class:`~ster.engine.tune.loop.LoopState`) and the type of each."""
MOMENTS = ("exp_avg", "exp_avg_sq", "step")
_FACTOR = re.compile(rf"layers\.(\d+)\.({'|'.join(TARGETS)})\.(a|b)")
_MOMENT = re.compile(rf"optimizer\.(\d+)\.({'|'.join(MOMENTS)})")


@dataclass(frozen=True)
class Saved:
    """A checkpoint's tensors and its three documents, as read."""

    file: TensorFile
    identity: dict[str, Any]
    loop: dict[str, Any]
    reference: dict[str, Any]

    def moments(self) -> dict[int, dict[str, str]]:
        """Optimizer index → moment → tensor name."""
        found: dict[int, dict[str, str]] = {}
        for name in self.file.tensors:
            match = _MOMENT.fullmatch(name)
            if match:
                found.setdefault(int(match[1]), {})[match[2]] = name
        return found

    def factors(self) -> list[str]:
        """The adapter's tensors (everything but the optimizer's), in the file's order."""
        return [name for name in self.file.tensors if not _MOMENT.fullmatch(name)]


@dataclass(frozen=True)
class Expected:
    """What the run resuming a checkpoint needs it to hold."""

    tensors: dict[str, tuple[int, ...]]
    """The adapter's tensors and shapes, in the optimizer's order."""
    total: int
    steps_per_epoch: int
    per_step: int
    units: int
    reference: set[int] | None
    """The unit indices a reference must score; None when the objective keeps no reference."""
    read_stats: Callable[[list[dict[str, Any]]], Any]
    """The objective reading per-unit numbers as it will at the end of the run (raises KeyError for one missing)."""


def defect(path: Path, phrase: str) -> Refusal:
    return Refusal(f"the checkpoint at {path} {phrase}; run without {flag('resume')} to start over")


def read_saved(path: Path) -> Saved:
    """The checkpoint's bytes parsed: a safetensors file with exactly Ster's three JSON documents."""
    try:
        file = parse(read_input(confine.readable(path), "the checkpoint"))
    except Damaged as exc:
        raise defect(path, str(exc)) from None
    except Refusal as exc:
        raise defect(path, f"could not be read ({exc})") from None
    unknown = sorted(set(file.metadata) - set(METADATA))
    if unknown:
        raise defect(path, f"holds the document {unknown[0]!r}, which no Ster checkpoint holds")
    documents = {}
    for key in METADATA:
        if key not in file.metadata:
            raise defect(path, f"lacks its {key} document")
        documents[key] = _document(path, key, file.metadata[key])
    return Saved(file, documents["identity"], documents["loop"], documents["reference"])


def _document(path: Path, key: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError, DuplicateKey):
        raise defect(path, f"holds a {key} document that is not JSON") from None
    if not isinstance(value, dict):
        raise defect(path, f"holds a {key} document that is not a JSON object")
    return value


def check_contents(saved: Saved, scale: float, path: Path) -> None:
    """Every check that needs neither torch nor the model (see the module's first step)."""
    _check_loop(saved.loop, path)
    _check_reference(saved.reference, path)
    _check_tensors(saved, path)
    _check_moments(saved, path)
    _check_factor_values(saved, scale, path)


def _check_loop(loop: dict[str, Any], path: Path) -> None:
    missing, unknown = sorted(set(LOOP) - set(loop)), sorted(set(loop) - set(LOOP))
    if unknown:
        raise defect(path, f"holds the loop field {unknown[0]!r}, which no Ster checkpoint has")
    if missing:
        raise defect(path, f"lacks the loop field {missing[0]!r}")
    for key, kind in LOOP.items():
        value = loop[key]
        optional = key in ("first_loss", "final_loss") and value is None
        if not optional and not _of_type(value, kind):
            raise defect(path, f"gives the loop's {key} as {_shown(value)}, which is not {_NOUN[kind]}")
    for key in ("step", "tokens", "seconds"):
        if loop[key] < 0:
            raise defect(path, f"gives the loop's {key} as {loop[key]}, below zero")
    if (loop["step"] == 0) != (loop["first_loss"] is None) or (loop["first_loss"] is None) != (
        loop["final_loss"] is None
    ):
        raise defect(
            path,
            f"records losses that do not go with step {loop['step']} (a run has a first and a "
            "final loss once it has taken a step, and none before)",
        )
    for key in ("epoch_stats", "epoch_history"):
        for number, entry in enumerate(loop[key]):
            if not isinstance(entry, dict) or not _all_finite(entry):
                raise defect(path, f"holds entry {number} of the loop's {key} that is not an object of finite numbers")


_NOUN = {int: "a whole number", float: "a finite number", list: "a list"}


def _of_type(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, kind)


def _all_finite(entry: dict[str, Any]) -> bool:
    return all(
        isinstance(key, str) and not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
        for key, value in entry.items()
    )


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | bool) or value is None else repr(value)


def _check_reference(reference: dict[str, Any], path: Path) -> None:
    for key, value in reference.items():
        if not (key.isdigit() and str(int(key)) == key):
            raise defect(path, f"scores reference unit {key!r}, which is not a unit's index")
        if not (isinstance(value, list) and len(value) == 2 and all(_of_type(v, float) for v in value)):
            raise defect(path, f"gives unit {key}'s reference scores as {_shown(value)}, not two finite numbers")


def _check_tensors(saved: Saved, path: Path) -> None:
    for name in saved.file.tensors:
        if not (_FACTOR.fullmatch(name) or _MOMENT.fullmatch(name) or name == REWARD_HEAD):
            raise defect(path, f"holds the tensor {name}, which no Ster checkpoint holds")
        if saved.file.dtype(name) != "F32":
            raise defect(path, f"stores the tensor {name} as {saved.file.dtype(name)}, where Ster writes F32")
        if not np.isfinite(saved.file.floats(name)).all():
            raise defect(path, f"holds a non-finite value in the tensor {name}")


def _check_moments(saved: Saved, path: Path) -> None:
    step = saved.loop["step"]
    for index, names in sorted(saved.moments().items()):
        if set(names) != set(MOMENTS):
            lacking = next(moment for moment in MOMENTS if moment not in names)
            raise defect(
                path,
                f"lacks the tensor optimizer.{index}.{lacking}, which goes with the other moments "
                f"of optimizer tensor {index}",
            )
        first, second, count = (saved.file.floats(names[moment]) for moment in MOMENTS)
        if first.shape != second.shape:
            raise defect(
                path,
                f"shapes optimizer.{index}.exp_avg {list(first.shape)} and optimizer.{index}."
                f"exp_avg_sq {list(second.shape)}, where one tensor's moments have its one shape",
            )
        if (second < 0).any():
            raise defect(path, f"holds a negative value in optimizer.{index}.exp_avg_sq, a running mean of squares")
        if count.shape != () or float(count) != step:
            raise defect(
                path, f"gives optimizer.{index}.step as {count.tolist()}, where the loop has taken {step} steps"
            )


def _check_factor_values(saved: Saved, scale: float, path: Path) -> None:
    """The adapter's factors within what an adapter file may hold, as the written adapter will be read."""
    names = saved.file.tensors
    try:
        for name in names:
            match = _FACTOR.fullmatch(name)
            if match and match[3] == "a" and f"layers.{match[1]}.{match[2]}.b" in names:
                pair = (name, f"layers.{match[1]}.{match[2]}.b")
                a, b = (saved.file.floats(n) for n in pair)
                if a.ndim == 2 and b.ndim == 2 and a.shape[0] == b.shape[1]:
                    check_factors(a, b, scale, pair, "tensor")
        if REWARD_HEAD in names:
            check_largest(saved.file.floats(REWARD_HEAD), f"tensor {REWARD_HEAD}")
    except Refusal as exc:
        raise defect(path, f"holds factors no adapter may hold: {exc}") from None


def check_fits(saved: Saved, expected: Expected, path: Path) -> None:
    """Every check against the run resuming the checkpoint (see the module's second step)."""
    _check_shapes(saved, expected, path)
    _check_state(saved, expected, path)
    _check_progress(saved.loop, expected, path)
    _check_stats(saved.loop, expected, path)
    _check_scored(saved.reference, expected, path)


def _check_shapes(saved: Saved, expected: Expected, path: Path) -> None:
    held = saved.factors()
    for name, shape in expected.tensors.items():
        if name not in held:
            raise defect(path, f"lacks the tensor {name}, which this run's adapter has")
        if saved.file.shape(name) != shape:
            raise defect(
                path,
                f"shapes the tensor {name} {list(saved.file.shape(name))}, where this run's adapter has {list(shape)}",
            )
    extra = [name for name in held if name not in expected.tensors]
    if extra:
        raise defect(path, f"holds the tensor {extra[0]}, which this run's adapter does not have")


def _check_state(saved: Saved, expected: Expected, path: Path) -> None:
    """AdamW keeps state for every trained tensor from the first step on, and for none before it."""
    moments, shapes = saved.moments(), list(expected.tensors.values())
    beyond = [index for index in moments if index >= len(shapes)]
    if beyond:
        raise defect(path, f"holds optimizer state for tensor {beyond[0]}, and this run trains {len(shapes)} tensors")
    for index, shape in enumerate(shapes):
        if saved.loop["step"] > 0 and index not in moments:
            raise defect(
                path, f"lacks the tensor optimizer.{index}.exp_avg, which every trained tensor has once a step is taken"
            )
        if saved.loop["step"] == 0 and index in moments:
            raise defect(path, f"holds optimizer state for tensor {index} at step 0, before any step")
        if index in moments and saved.file.shape(moments[index]["exp_avg"]) != shape:
            raise defect(
                path,
                f"shapes optimizer.{index}.exp_avg {list(saved.file.shape(moments[index]['exp_avg']))}"
                f", where the tensor it goes with has {list(shape)}",
            )


def _check_progress(loop: dict[str, Any], expected: Expected, path: Path) -> None:
    step, per_epoch = loop["step"], expected.steps_per_epoch
    if step > expected.total:
        raise defect(path, f"is at step {step}, beyond the {expected.total} steps of this run")
    epochs_done = step // per_epoch
    in_epoch = step - (step - 1) // per_epoch * per_epoch if step else 0  # steps of the epoch the stats are of
    units = min(in_epoch * expected.per_step, expected.units)
    if len(loop["epoch_stats"]) != units:
        raise defect(
            path,
            f"holds {len(loop['epoch_stats'])} per-unit numbers for the epoch in progress, where "
            f"step {step} implies {units}",
        )
    if len(loop["epoch_history"]) != epochs_done:
        raise defect(
            path,
            f"holds {len(loop['epoch_history'])} finished epochs in its history, where step {step} "
            f"implies {epochs_done}",
        )


def _check_stats(loop: dict[str, Any], expected: Expected, path: Path) -> None:
    """The per-unit numbers and history entries must be the ones the objective reads and writes."""
    stats = loop["epoch_stats"]
    if not stats:
        return
    try:
        entry = expected.read_stats(stats)
    except KeyError as exc:
        raise defect(
            path, f"lacks the number {exc.args[0]!r} in its per-unit numbers, which this objective reads"
        ) from None
    for number, old in enumerate(loop["epoch_history"]):
        if set(old) != set(entry):
            raise defect(
                path,
                f"holds history entry {number} with fields {sorted(old)}, where this objective writes {sorted(entry)}",
            )


def _check_scored(reference: dict[str, Any], expected: Expected, path: Path) -> None:
    scored = {int(key) for key in reference}
    if expected.reference is None:
        if scored:
            raise defect(path, "holds reference scores, which this objective does not keep")
        return
    missing, extra = sorted(expected.reference - scored), sorted(scored - expected.reference)
    if missing:
        raise defect(path, f"lacks the reference scores of unit {missing[0]}, which this run trains on")
    if extra:
        raise defect(path, f"scores reference unit {extra[0]}, which this run does not train on")
