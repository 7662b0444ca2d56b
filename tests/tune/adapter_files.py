"""Adapter artifacts for the tests that apply them: written directly (fast, any shape a test needs),
or edited after writing to break one thing at a time."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import torch

from ster.engine.model.adapters.artifact import AdapterSidecar, factor_names, sidecar_path
from ster.engine.model.adapters.lora import Adapter, save_adapter
from ster.engine.model.config import DecoderConfig, load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.resolve import resolve_model

PROMPT = "question : how many legs does a cat have ? answer :"


def toy_config(model: str = "ster:toy") -> tuple[DecoderConfig, str]:
    source = resolve_model(model)
    config = load_config(source.config)
    return config, checkpoint_fingerprint(config, source.weights)


def write_adapter(
    path: Path,
    *,
    model: str = "ster:toy",
    kind: str = "adapter",
    rank: int = 4,
    alpha: float = 8.0,
    targets: tuple[str, ...] = ("query", "value"),
    layers: tuple[int, ...] = (0, 1, 2, 3),
    b_scale: float = 0.0,
    head_scale: float = 0.0,
    seed: int = 0,
    train: dict[str, Any] | None = None,
) -> Adapter:
    """A Ster adapter artifact for the toy: A drawn as training draws it, B (and a reward head) drawn at
    ``b_scale`` (``head_scale``); zero B is a fresh, identity adapter."""
    config, fingerprint = toy_config(model)
    adapter = Adapter.fresh(
        config, rank, alpha, list(targets), list(layers), seed, torch.device("cpu"), reward=kind == "reward"
    )
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in layers:
            for target in targets:
                b = adapter.tensors[factor_names(layer, target)[1]]
                b.copy_(torch.randn(b.shape, generator=generator) * b_scale)
        if adapter.head is not None:
            adapter.head.copy_(torch.randn(adapter.head.shape, generator=generator) * head_scale)
    sidecar = AdapterSidecar(
        kind=kind,
        model=model,
        model_fingerprint=fingerprint,
        rank=rank,
        alpha=alpha,
        targets=list(targets),
        layers=list(layers),
        hidden_size=config.hidden_size,
        train=train,
    )
    save_adapter(path, sidecar, adapter, config)
    return adapter


def edit_sidecar(path: Path, **changes: Any) -> None:
    side = sidecar_path(path)
    document = json.loads(side.read_text())
    document.update(changes)
    side.write_text(json.dumps(document))


def rewrite_tensors(path: Path, change: Any) -> None:
    """Replace the adapter's safetensors file by ``change(tensors)``'s result, bypassing every check; the sidecar
    records the new file's hash, so the one defect made is the one a reader meets (not a pair of two writes)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    save_file(change(dict(tensors)), str(path))
    record_hash(path)


def record_hash(path: Path) -> None:
    """Make the sidecar record the hash of the adapter file as it is now (after a test rewrote it)."""
    edit_sidecar(path, tensors_sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))
