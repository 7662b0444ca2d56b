"""Resumable checkpoints of a training run, beside its output.

``<output>.checkpoint`` is a safetensors file. Its tensors are the adapter's (under
their artifact names) and AdamW's state (``optimizer.{i}.exp_avg``, ``.exp_avg_sq``
and ``.step`` of the i-th trainable tensor); its metadata holds, as JSON, the run's
identity (its objective and flags, the model's fingerprint, a digest of the encoded data), the
loop's plain numbers (optimizer steps done, the per-unit numbers of the epoch in
progress, the history) and the objective's reference scores. Floats go through JSON
exactly, so a resumed run ends byte for byte where an uninterrupted one would. Nothing
else needs saving: each epoch's order is re-derived from ``--seed + epoch`` and the
learning rate from the step, and the loop draws no other random numbers.

Reading the identity needs no torch, so a checkpoint of another run is refused with
the other refusals, before the weights load, naming the first difference. It is
written atomically; once the final adapter is written the checkpoint is removed.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import safetensors_header, write_atomic

NOT_IDENTITY = {"output", "resume", "checkpoint_every", "device", "model", "revision", "examples", "pairs"}
"""Fields that do not change what a run computes (where it writes, how often it saves, where it
runs) or that the fingerprint and the data digest stand for (where the model and the data lie)."""
MOMENTS = ("exp_avg", "exp_avg_sq", "step")


def checkpoint_path(output: Path) -> Path:
    return output.with_name(output.name + ".checkpoint")


def run_identity(request: Any, fingerprint: str, units: list[Any]) -> dict[str, Any]:
    """What makes two runs the same run: the objective and its flags, the model, and the encoded units."""
    identity = {k: v for k, v in request.model_dump(mode="json").items() if k not in NOT_IDENTITY}
    identity["objective"] = request.subject
    identity["targets"] = ",".join(request.target_names)  # one spelling: q_proj and query are one target
    identity["model_fingerprint"] = fingerprint
    identity["data"] = hashlib.sha256(json.dumps(units).encode()).hexdigest()
    return identity


def check_checkpoint(path: Path, identity: dict[str, Any]) -> None:
    """Refuse, in one sentence, a missing or unreadable checkpoint, or one of another run; no torch."""
    if not path.exists():
        raise Refusal(f"--resume was given, but there is no checkpoint at {path}; run without --resume to start")
    theirs = _metadata(path)["identity"]
    named = ["objective", "model_fingerprint", "data"]
    flags = sorted((set(identity) | set(theirs)) - set(named))
    for key in [named[0], *flags, *named[1:]]:
        if identity.get(key) != theirs.get(key):
            raise Refusal(f"the checkpoint at {path} belongs to another run: {_difference(key, theirs, identity)}; "
                          "run without --resume to start over")


def save_checkpoint(path: Path, identity: dict[str, Any], tensors: dict[str, Any], optimizer: dict[str, Any],
                    loop: dict[str, Any], reference: dict[int, tuple[float, float]]) -> None:
    """Write the checkpoint atomically; ``optimizer`` is AdamW's ``state_dict()``."""
    from safetensors.torch import save

    state = dict(tensors)
    for index, moments in optimizer["state"].items():
        state.update({f"optimizer.{index}.{name}": moments[name].detach().cpu().contiguous() for name in MOMENTS})
    metadata = {"identity": identity, "loop": loop, "reference": {str(k): list(v) for k, v in reference.items()}}
    write_atomic(path, save(state, metadata={key: json.dumps(value) for key, value in metadata.items()}))


def load_checkpoint(path: Path, optimizer: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``tensors``, ``optimizer`` (``optimizer``, a fresh AdamW's ``state_dict()``, with the
    saved state put in), ``loop`` and ``reference``. Call :func:`check_checkpoint` first."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    metadata = _metadata(path)
    try:
        saved = load(path.read_bytes())
    except (OSError, SafetensorError):
        raise _unreadable(path) from None
    state: dict[int, dict[str, Any]] = {}
    for index in range(len(optimizer["param_groups"][0]["params"])):
        if f"optimizer.{index}.step" in saved:
            state[index] = {name: saved.pop(f"optimizer.{index}.{name}") for name in MOMENTS}
    return {"tensors": saved, "optimizer": {**optimizer, "state": state}, "loop": metadata["loop"],
            "reference": {int(k): tuple(v) for k, v in metadata["reference"].items()}}


def _metadata(path: Path) -> dict[str, Any]:
    """The JSON documents in the checkpoint's safetensors header."""
    try:
        header = safetensors_header(path)
        documents = {key: json.loads(value) for key, value in header["__metadata__"].items()}
    except (OSError, struct.error, ValueError, KeyError, TypeError, AttributeError):
        raise _unreadable(path) from None
    if not all(isinstance(documents.get(key), dict) for key in ("identity", "loop", "reference")):
        raise _unreadable(path)
    return documents


def _unreadable(path: Path) -> Refusal:
    return Refusal(f"the checkpoint at {path} could not be read; run without --resume to start over")


def _difference(key: str, theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    if key == "objective":
        return f"it was made by {_shown(theirs.get(key))}, and this run is {ours[key]}"
    if key == "data":
        return "its training data differs from this run's"
    if key == "model_fingerprint":
        return "it was made on another model"
    flag = "--" + key.replace("_", "-")
    return f"its {flag} is {_shown(theirs.get(key))}, this run's is {_shown(ours.get(key))}"


def _shown(value: Any) -> str:
    return "not set" if value is None else str(value)
