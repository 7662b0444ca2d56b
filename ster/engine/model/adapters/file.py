"""An adapter's safetensors file read wholly, checked against its sidecar before any value is used; no torch.

Every reader of a Ster adapter (``tune inspect``, ``--adapter`` on every command, ``tune merge``,
``tune export-peft``, ``tune grpo --reward``) goes through :func:`read_adapter`, which refuses in
one sentence, in this order:

* a file that is not the safetensors file its header describes: cut short, bytes after the
  last tensor, offsets that do not tile the data (:mod:`ster.engine.protocol.tensorfile`);
* a pair from two different writes: the SHA-256 of the file's bytes is not the one the sidecar
  records (an adapter written before Ster recorded it has none, and is read without this check);
* a tensor the sidecar does not declare, or one it declares missing or shaped otherwise than its
  rank, targets and layers imply (the widths are judged where the sidecar's width and the model's
  projections are: :func:`ster.engine.model.adapters.artifact.check_tensors` with the model, ``tune inspect``
  and ``export-peft`` with the sidecar's ``hidden_size``);
* a value that is not a floating-point number, not finite, or so large that applying it could
  overflow f32 (:data:`LIMIT`).

The same checks of values serve a PEFT directory's factors (:func:`check_factors`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ster.engine.model.adapters.artifact import (
    REWARD_HEAD,
    AdapterSidecar,
    check_tensors,
    factor_names,
    read_sidecar,
    sidecar_path,
)
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.inputs import read_input
from ster.engine.protocol.tensorfile import FLOATS, Damaged, TensorFile, parse

LIMIT = 1e24
"""The largest magnitude Ster applies: of a factor's entry, of a reward head's, of ``alpha / rank``, and of
``max(1, alpha / rank) · Σ_r max|B[:, r]| · max|A[r, :]|``, a bound on the update's entries whatever the
order of the products. Why: f32 overflows at 3.4e38; a forward multiplies these by activations below 65504
(f16's largest value, which every model Ster runs keeps to) and sums over at most 2^24 of them (the widest
width Ster reads), a growth of at most 1.1e12, so 1e24 keeps a margin of 300 before an overflow. Trained
factors are below 1e3 by far; anything near the bound is damage, not training."""


@dataclass(frozen=True)
class AdapterFile:
    """An adapter's sidecar and its safetensors file, every check that needs no model passed."""

    path: Path
    sidecar: AdapterSidecar
    file: TensorFile

    @property
    def header(self) -> dict[str, dict[str, Any]]:
        """Tensor name → {dtype, shape, data_offsets}, as the safetensors header gives them."""
        return self.file.tensors

    def floats(self, name: str) -> np.ndarray:
        return self.file.floats(name)


def read_adapter(path: Path) -> AdapterFile:
    """The adapter at ``path`` read wholly and checked against its sidecar (see the module's list)."""
    sidecar = read_sidecar(path)
    raw = read_input(confine.readable(path), "adapter")
    file = parse_file(raw, f"failed to read adapter {path}: it")
    check_pair(sidecar, raw, path)
    check_tensors(sidecar, file.tensors, shapes_alone(sidecar, file.tensors), path)
    for name in file.tensors:
        check_float(file, name, "adapter tensor")
        if 0 in file.shape(name):
            raise Refusal(f"adapter tensor {name} has shape {list(file.shape(name))}, which holds no values")
    check_values(sidecar, file)
    return AdapterFile(path, sidecar, file)


def parse_file(raw: bytes, what: str) -> TensorFile:
    """``raw`` as a safetensors file, refused with ``what`` and the defect when it is not one."""
    try:
        return parse(raw)
    except Damaged as exc:
        raise Refusal(f"{what} {exc}") from None


def digest(data: bytes) -> str:
    """What a sidecar records of its safetensors file: the SHA-256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def check_pair(sidecar: AdapterSidecar, raw: bytes, path: Path) -> None:
    """Refuse a sidecar whose recorded hash is not the file's: the two files come from two writes."""
    recorded = sidecar.tensors_sha256
    if recorded is None:
        return  # written before Ster recorded the hash: nothing binds the pair, and it is read as it was
    actual = digest(raw)
    if actual != recorded:
        raise Refusal(
            f"adapter {path} and its sidecar {sidecar_path(path)} are from two different writes (the "
            f"sidecar records tensors of SHA-256 {recorded[:12]}…, the file's are {actual[:12]}…), so "
            "neither describes the other; write the adapter again or restore both files together"
        )


def shapes_alone(sidecar: AdapterSidecar, header: dict[str, dict[str, Any]]) -> dict[str, tuple[int, ...]]:
    """Every tensor the sidecar declares, with the shape the sidecar alone fixes: each A ``rank`` rows, each B
    ``rank`` columns, a reward head one row, two axes each. The widths are taken from the file here: they are
    judged against the sidecar's ``hidden_size`` and the model's projections where those are known
    (``tune inspect``, ``export-peft``, and every command that applies the adapter to a model), after the
    sentence that says the adapter is for another width."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in sidecar.layers:
        for target in sidecar.targets:
            a, b = factor_names(layer, target)
            shapes[a] = (sidecar.rank, _axis(header, a, 1))
            shapes[b] = (_axis(header, b, 0), sidecar.rank)
    if sidecar.kind == "reward":
        shapes[REWARD_HEAD] = (1, _axis(header, REWARD_HEAD, 1))
    return shapes


def _axis(header: dict[str, dict[str, Any]], name: str, axis: int) -> int:
    shape = header.get(name, {}).get("shape", [])
    return int(shape[axis]) if len(shape) == 2 else 0


def check_float(file: TensorFile, name: str, what: str) -> None:
    """Refuse a tensor that is not stored as floating-point numbers (Ster writes F32; PEFT also F16, BF16)."""
    if file.dtype(name) not in FLOATS:
        raise Refusal(f"{what} {name} is stored as {file.dtype(name)}, not as floating-point numbers")


def check_values(sidecar: AdapterSidecar, file: TensorFile) -> None:
    """Refuse a factor or head that is not finite or could overflow f32 once applied (the writer checks this too)."""
    for layer in sidecar.layers:
        for target in sidecar.targets:
            a, b = factor_names(layer, target)
            check_factors(file.floats(a), file.floats(b), sidecar.scale, (a, b), "adapter tensor")
    if sidecar.kind == "reward":
        head = file.floats(REWARD_HEAD)
        _check_finite(head, f"adapter tensor {REWARD_HEAD}")
        check_largest(head, f"adapter tensor {REWARD_HEAD}")


def check_factors(a: np.ndarray, b: np.ndarray, scale: float, names: tuple[str, str], what: str) -> None:
    """Refuse factors A ``[r, in]`` and B ``[out, r]`` applied at ``scale`` that hold a non-finite value or
    could overflow f32 once applied (see :data:`LIMIT`)."""
    for name, tensor in zip(names, (a, b), strict=True):
        _check_finite(tensor, f"{what} {name}")
    check_largest(a, f"{what} {names[0]}")
    if not scale <= LIMIT:
        raise Refusal(
            f"{what}s {names[0]} and {names[1]} are applied at alpha / rank {scale:.3g}, beyond "
            f"{LIMIT:.0e}, the largest scale Ster applies without risking an f32 overflow"
        )
    if a.size == 0 or b.size == 0:
        return
    bound = max(1.0, scale) * float(
        np.dot(np.abs(b).max(axis=0).astype(np.float64), np.abs(a).max(axis=1).astype(np.float64))
    )
    if not bound <= LIMIT:
        raise Refusal(
            f"{what}s {names[0]} and {names[1]} can make an update as large as {bound:.3g}, beyond "
            f"{LIMIT:.0e}, the largest Ster applies without risking an f32 overflow in a forward"
        )


def _check_finite(values: np.ndarray, what: str) -> None:
    if not np.isfinite(values).all():
        raise Refusal(f"{what} contains a non-finite value")


def check_largest(values: np.ndarray, what: str) -> None:
    """Refuse values beyond :data:`LIMIT` in magnitude."""
    largest = float(np.abs(values).max(initial=0.0))
    if largest > LIMIT:
        raise Refusal(
            f"{what} holds {largest:.3g}, beyond {LIMIT:.0e}, the largest value Ster applies without "
            "risking an f32 overflow in a forward"
        )
