"""The ``tune inspect`` job: an adapter's sidecar with every tensor's name, shape and dtype; no model.

The sidecar is checked as every loader checks it (a steering artifact is refused by the
cross-document sentence), and the safetensors header against what the sidecar declares as
far as it can be without the model's config: every factor present and nothing else, each
A with ``rank`` rows and each B with ``rank`` columns, the sides that touch the residual
stream ``hidden_size`` wide, and a reward model's head ``[1, hidden_size]``. Each tensor's
dtype is the header's. A PEFT directory is read as the adapter it applies as (its config and
grid refused as applying refuses them; peft parses the config, so that path imports torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ster.engine.model.adapters.apply import read_document
from ster.engine.model.adapters.artifact import REWARD_HEAD, AdapterSidecar, check_tensors, factor_names
from ster.engine.protocol import confine
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.requests import TuneInspectRequest

READS_HIDDEN = ("query", "key", "value", "gate", "up")
"""Targets whose A reads the residual stream (``hidden_size`` columns)."""
WRITES_HIDDEN = ("output", "down")
"""Targets whose B writes the residual stream (``hidden_size`` rows)."""


class TensorEntry(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    """The safetensors dtype (F32 for every factor Ster writes)."""


class AdapterDocument(BaseModel):
    schema_version: int
    product: str
    """``ster``; ``peft`` for a PEFT directory (read as the adapter it applies as)."""
    kind: str
    model: str
    model_revision: str | None
    model_fingerprint: str | None
    rank: int
    alpha: float
    scale: float
    targets: list[str]
    layers: list[int]
    hidden_size: int
    tensors: list[TensorEntry]
    """In the sidecar's order: per layer, per target, A then B; then the reward head."""
    train: dict[str, Any] | None


class InspectResult(BaseModel):
    """What ``tune inspect`` prints."""

    adapter: AdapterDocument


def inspect_job(request: TuneInspectRequest, ctx: JobContext) -> InspectResult:
    path = request.artifact  # (its sidecar is found beside it, so each is pinned on its own as it is read)
    if confine.readable(path).is_dir():
        return _peft(path)
    sidecar, header = read_document(path)
    expected = _expected(sidecar)
    check_tensors(sidecar, header, _filled(expected, header), path)
    tensors = [
        TensorEntry(name=name, shape=list(header[name]["shape"]), dtype=str(header[name].get("dtype", "")))
        for name in expected
    ]
    return InspectResult(
        adapter=AdapterDocument(
            **sidecar.model_dump(exclude={"train"}), scale=sidecar.scale, tensors=tensors, train=sidecar.train
        )
    )


def _peft(path: Path) -> InspectResult:
    """A PEFT directory: its config and factors as the adapter Ster applies (no fingerprint, no report)."""
    from ster.engine.model.adapters.peft_format import peft_document

    sidecar, tensors = peft_document(path)
    fields = sidecar.model_dump(exclude={"train"})
    fields["product"] = "peft"
    return InspectResult(
        adapter=AdapterDocument(
            **fields,
            scale=sidecar.scale,
            train=None,
            tensors=[TensorEntry(name=name, shape=shape, dtype=dtype) for name, shape, dtype in tensors],
        )
    )


def _expected(sidecar: AdapterSidecar) -> dict[str, tuple[int | None, int | None]]:
    """Every tensor the sidecar declares, with the axes known without the model (None: known only with it)."""
    rank, hidden = sidecar.rank, sidecar.hidden_size
    shapes: dict[str, tuple[int | None, int | None]] = {}
    for layer in sidecar.layers:
        for target in sidecar.targets:
            a, b = factor_names(layer, target)
            shapes[a] = (rank, hidden if target in READS_HIDDEN else None)
            shapes[b] = (hidden if target in WRITES_HIDDEN else None, rank)
    if sidecar.kind == "reward":
        shapes[REWARD_HEAD] = (1, hidden)
    return shapes


def _filled(
    expected: dict[str, tuple[int | None, int | None]], header: dict[str, dict[str, Any]]
) -> dict[str, tuple[int, ...]]:
    """The expected shapes with each axis only the model would know taken from the file, for ``check_tensors``."""
    filled: dict[str, tuple[int, ...]] = {}
    for name, shape in expected.items():
        got = list(header.get(name, {}).get("shape", ()))
        filled[name] = tuple(
            got[axis] if want is None and len(got) == 2 else (want or 0) for axis, want in enumerate(shape)
        )
    return filled
