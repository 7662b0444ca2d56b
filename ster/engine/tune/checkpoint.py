"""Resumable checkpoints of a training run, beside its output.

``<output>.checkpoint`` holds everything the loop needs to go on exactly where it
stopped: the adapter's tensors, AdamW's moments and step counts, the optimizer steps
done, the per-unit numbers of the epoch in progress, the objective's reference scores,
and the run's identity (its flags, the model's fingerprint, a digest of the encoded
data). The order of every epoch is re-derived from the seed, so it need not be stored.
It is written atomically; a checkpoint of another run is refused naming the first
difference; once the final adapter is written the checkpoint is removed.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import torch

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import write_atomic

NOT_IDENTITY = {"output", "resume", "checkpoint_every", "device"}
"""Flags that do not change what a run computes, so a resumed run may give them anew."""


def checkpoint_path(output: Path) -> Path:
    return output.with_name(output.name + ".checkpoint")


def run_identity(request: Any, fingerprint: str, rows: list[tuple[list[int], ...]]) -> dict[str, Any]:
    """What makes two runs the same run: their flags, the model, and the encoded data."""
    identity = {k: v for k, v in request.model_dump(mode="json").items() if k not in NOT_IDENTITY}
    identity["model_fingerprint"] = fingerprint
    identity["data"] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return identity


def save_checkpoint(path: Path, identity: dict[str, Any], payload: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save({"identity": identity, **payload}, buffer)
    write_atomic(path, buffer.getvalue())


def load_checkpoint(path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at ``path``, refused when it belongs to another run."""
    if not path.exists():
        raise Refusal(f"--resume was given, but there is no checkpoint at {path}; run without --resume to start")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise Refusal(f"the checkpoint at {path} could not be read; run without --resume to start over") from None
    theirs = saved.get("identity", {}) if isinstance(saved, dict) else {}
    for key in sorted(set(identity) | set(theirs)):
        if identity.get(key) != theirs.get(key):
            raise Refusal(f"the checkpoint at {path} belongs to another run: {_difference(key, theirs, identity)}; "
                          "run without --resume to start over")
    return saved  # type: ignore[no-any-return]


def _difference(key: str, theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    if key == "data":
        return "its training data differs from this run's"
    if key == "model_fingerprint":
        return "it was made on another checkpoint of the model"
    flag = "--" + key.replace("_", "-")
    return f"its {flag} is {theirs.get(key)}, this run's is {ours.get(key)}"
