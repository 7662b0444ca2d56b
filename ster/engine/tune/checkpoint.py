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
the other refusals, before the weights load, naming the first difference; so is a
checkpoint with any value no run of Ster's writes, and, once the run has built its adapter
and its loop, one that does not fit them (:mod:`ster.engine.tune.checkpoint_values`). It
is written atomically; once the final adapter is written the checkpoint is removed. The
path is Ster's alone: a run refuses to start when anything but a checkpoint of Ster's lies
there (:func:`check_slot`), so neither the writing nor the removal destroys a user's file.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import write_atomic
from ster.engine.protocol.kinds import existing
from ster.engine.protocol.naming import flag
from ster.engine.tune.checkpoint_values import METADATA, Expected, Saved, check_contents, check_fits, read_saved

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


def check_slot(path: Path) -> None:
    """Refuse, before a run starts, a checkpoint path that holds anything but a checkpoint of Ster's (or an
    empty file): the run would replace it with its first checkpoint, and remove it at the end."""
    target = confine.writable(path, make=False)
    found = existing(target)
    if found is None or found.empty:
        return
    if not found.file or not is_checkpoint(target):
        held = "a file that is not a checkpoint of Ster's" if found.file else found.phrase
        raise Refusal(
            f"{path} is where this run keeps its checkpoint, and it holds {held}, which the run would "
            f"destroy; move it or give another {flag('output')}"
        )


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` begins as Ster's checkpoints do: a safetensors header carrying Ster's three documents."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:
                return False
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError, RecursionError):
        return False
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(metadata, dict) and set(METADATA) <= set(metadata)


def remove_checkpoint(path: Path) -> None:
    """Remove the run's checkpoint once its adapter is written; anything else found there is left."""
    target = confine.writable(path, make=False)
    if is_checkpoint(target):
        target.unlink(missing_ok=True)


def check_checkpoint(path: Path, identity: dict[str, Any]) -> Saved:
    """Refuse, in one sentence, a missing or unreadable checkpoint, one of another run, or one holding a value no
    run writes; no torch. What it read is returned."""
    if not confine.readable(path).exists():
        raise Refusal(
            f"{flag('resume')} was given, but there is no checkpoint at {path}; run without {flag('resume')} to start"
        )
    saved = read_saved(path)
    theirs = saved.identity
    named = ["objective", "model_fingerprint", "data"]
    flags = sorted((set(identity) | set(theirs)) - set(named))
    for key in [named[0], *flags, *named[1:]]:
        if identity.get(key) != theirs.get(key):
            raise Refusal(
                f"the checkpoint at {path} belongs to another run: {_difference(key, theirs, identity)}; "
                f"run without {flag('resume')} to start over"
            )
    check_contents(saved, float(identity["alpha"]) / int(identity["rank"]), path)
    return saved


def save_checkpoint(
    path: Path,
    identity: dict[str, Any],
    tensors: dict[str, Any],
    optimizer: dict[str, Any],
    loop: dict[str, Any],
    reference: dict[int, tuple[float, float]],
) -> None:
    """Write the checkpoint atomically; ``optimizer`` is AdamW's ``state_dict()``."""
    from safetensors.torch import save

    state = dict(tensors)
    for index, moments in optimizer["state"].items():
        state.update({f"optimizer.{index}.{name}": moments[name].detach().cpu().contiguous() for name in MOMENTS})
    metadata = {"identity": identity, "loop": loop, "reference": {str(k): list(v) for k, v in reference.items()}}
    # keep: the checkpoint is what a cancelled run writes, so a set cancel flag must not refuse it
    write_atomic(path, save(state, metadata={key: json.dumps(value) for key, value in metadata.items()}), keep=True)


def load_checkpoint(
    path: Path, identity: dict[str, Any], expected: Expected, optimizer: dict[str, Any]
) -> dict[str, Any]:
    """The checkpoint's ``tensors``, ``optimizer`` (``optimizer``, a fresh AdamW's ``state_dict()``, with the
    saved state put in), ``loop`` and ``reference``, read once and checked wholly (again: the file is read
    now, and these bytes are the ones used) against ``identity`` and what the run ``expected``."""
    import numpy as np
    import torch

    saved = check_checkpoint(path, identity)
    check_fits(saved, expected, path)

    def tensor(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(saved.file.floats(name), dtype=np.float32))

    moments = saved.moments()
    state = {index: {name: tensor(moments[index][name]) for name in MOMENTS} for index in sorted(moments)}
    return {
        "tensors": {name: tensor(name) for name in expected.tensors},
        "optimizer": {**optimizer, "state": state},
        "loop": saved.loop,
        "reference": {int(k): tuple(v) for k, v in saved.reference.items()},
    }


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
