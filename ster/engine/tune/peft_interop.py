"""``ster tune export-peft``: a Ster adapter written as a directory ``peft.PeftModel.from_pretrained`` loads.

No model is opened: the factors' shapes come from the adapter file itself, and are checked
against each other (every factor of a target the same shape on every layer, each B's rank
its A's, the widths the sidecar and the projections imply) before torch is imported. Only the
trained model's config.json is read, for the projections transformers' model fuses (Phi-3's
``qkv_proj``, ``gate_up_proj``), which PEFT must name instead of the pieces. The directory
format is :mod:`ster.engine.model.adapters.peft_format`'s, which also reads such directories back for
``--adapter``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ster.engine.model.adapters.apply import open_document
from ster.engine.model.adapters.artifact import AdapterSidecar, check_tensors, factor_names
from ster.engine.model.adapters.file import AdapterFile
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import check_output_directory
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag
from ster.engine.tune.requests import ExportPeftRequest

READS_HIDDEN = ("query", "key", "value", "gate", "up")
"""Targets whose input is the residual stream; ``output`` and ``down`` write to it."""
SAME_WIDTH = (
    (("query", 0), ("output", 1), "the attention width"),
    (("key", 0), ("value", 0), "the key-value width"),
    (("gate", 0), ("up", 0), "the feed-forward width"),
    (("gate", 0), ("down", 1), "the feed-forward width"),
    (("up", 0), ("down", 1), "the feed-forward width"),
)
"""Pairs of (target, axis of its (out, in)) that one width of the model fixes, and what that width is."""


class ExportPeftResult(BaseModel):
    """Where the PEFT directory is and what it holds."""

    output: str
    base_model: str
    rank: int
    alpha: float
    target_modules: list[str]
    """The modules PEFT adapts, named as in transformers' model (a fused projection such as Phi-3's ``qkv_proj``
    once), in Ster's target order."""
    layers: list[int]
    tensors: int
    files: list[str]


def export_job(request: ExportPeftRequest, ctx: JobContext) -> ExportPeftResult:
    check_output_directory(request.output, flag("output"))
    document = open_document(request.adapter)  # read wholly: its bytes, the pair's hash, every value
    sidecar = document.sidecar
    if sidecar.kind == "reward":
        raise Refusal("adapter artifact is a reward model, not a generation adapter")
    check_factor_shapes(sidecar, document.header, request.adapter)
    base_model = request.base_model or sidecar.model
    from ster.engine.model.adapters.peft_format import model_layout, peft_modules, write_peft_dir

    try:
        layout = model_layout(sidecar.model, sidecar.model_revision)  # Phi-3's fused projections: config.json only
    except Refusal as exc:  # the model is gone or offline: the adapter is still exported, under the separate names
        ctx.warn(f"{exc}; the PEFT directory names each projection on its own, as every family but Phi-3 has them")
        layout = {}
    ctx.progress("export", f"writing {request.adapter} as a PEFT adapter for {base_model}")
    tensors = _load(document)  # torch, once every input has been checked
    files = write_peft_dir(request.output, sidecar, tensors, base_model, layout)
    return ExportPeftResult(
        output=str(request.output),
        base_model=base_model,
        rank=sidecar.rank,
        alpha=sidecar.alpha,
        target_modules=[m for m, _ in peft_modules(sidecar.targets, layout)],
        layers=sidecar.layers,
        tensors=len(tensors),
        files=files,
    )


def check_factor_shapes(sidecar: AdapterSidecar, header: dict[str, dict[str, Any]], path: Path) -> None:
    """Refuse factors no single model could carry: the projections' shapes, read off the first layer's
    factors, must hold on every layer and agree where one width of the model fixes two of them."""
    widths = {target: _widths(sidecar, header, target) for target in sidecar.targets}
    expected: dict[str, tuple[int, ...]] = {}
    for target, (out, inner) in widths.items():
        for layer in sidecar.layers:
            a, b = factor_names(layer, target)
            expected[a], expected[b] = (sidecar.rank, inner), (out, sidecar.rank)  # [rank, in] and [out, rank]
    check_tensors(sidecar, header, expected, path)
    for (first, axis1), (second, axis2), what in SAME_WIDTH:
        if first in widths and second in widths and widths[first][axis1] != widths[second][axis2]:
            raise Refusal(
                f"adapter factors disagree on {what}: {first} gives {widths[first][axis1]} and {second} "
                f"gives {widths[second][axis2]}"
            )


def _widths(sidecar: AdapterSidecar, header: dict[str, dict[str, Any]], target: str) -> tuple[int, int]:
    """(out, in) of a target's projection: the hidden size on the residual side, the first layer's factor elsewhere."""
    out = inner = sidecar.hidden_size
    if target in READS_HIDDEN:
        out = _axis(header, [factor_names(layer, target)[1] for layer in sidecar.layers], 0)
    else:
        inner = _axis(header, [factor_names(layer, target)[0] for layer in sidecar.layers], 1)
    return out, inner


def _axis(header: dict[str, dict[str, Any]], names: list[str], axis: int) -> int:
    """The size of ``axis`` in the first of ``names`` the file holds with two axes (0 when none: refused later)."""
    for name in names:
        shape = header.get(name, {}).get("shape", [])
        if len(shape) == 2:
            return int(shape[axis])
    return 0


def _load(document: AdapterFile) -> dict[str, Any]:
    """The checked file's tensors as f32 torch tensors (the bytes that were checked, not the file read again)."""
    import numpy as np
    import torch

    return {name: torch.from_numpy(np.array(document.floats(name), dtype=np.float32)) for name in document.header}
