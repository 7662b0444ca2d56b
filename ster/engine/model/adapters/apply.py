"""Applying a trained adapter to a checkpoint: every check first, then the factors, then the attachment.

Every command that reads an adapter (``generate``, ``extract``, ``train``, ``optimize``,
``evaluate``, ``sweep`` with ``--adapter``, and ``tune evaluate``) goes through here, in two
steps so that a bad adapter is refused before torch is imported:

* :func:`check_adapter` reads the adapter wholly (:func:`ster.engine.model.adapters.file.read_adapter`:
  the sidecar's own refusals — missing, another product or schema, a field no adapter has, a
  steering artifact given instead —, the file's bytes against its header, the pair's hash, every
  tensor's presence, shape and values), then the kind (a reward model is not a generation
  adapter, and the other way round) and the model and width it was trained for.
  It logs the fingerprint note and warns the provenance sentences (chat template, precision);
* :func:`adapted` puts the factors it checked (the very bytes, not the file read again) onto the
  decoder's device and attaches them for the length of a ``with`` block.

A directory is a PEFT adapter (``adapter_config.json`` and ``adapter_model.safetensors``,
trained elsewhere with PEFT or TRL): :mod:`ster.engine.model.adapters.peft_format` reads it into the
same sidecar and factors, checking each factor's shape against the model once it is read.
Nothing here imports torch at module level.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ster.engine.model.adapters.artifact import (
    AdapterSidecar,
    adapter_provenance,
    check_for_model,
    check_tensors,
    sidecar_path,
)
from ster.engine.model.adapters.file import AdapterFile, read_adapter
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal

if TYPE_CHECKING:
    import torch

    from ster.engine.model.adapters.lora import Adapter
    from ster.engine.model.config import DecoderConfig
    from ster.engine.model.contract import Decoder
    from ster.engine.model.loading import Checkpoint
    from ster.engine.protocol.jobs import JobContext

Want = Literal["adapter", "reward"]


@dataclass(frozen=True)
class CheckedAdapter:
    """An adapter that passed every check a header allows; its factors are read by :func:`adapted`."""

    path: Path
    sidecar: AdapterSidecar | None
    """None for a PEFT directory, whose checks run when it is read."""
    want: Want
    document: AdapterFile | None = None
    """The file as it was checked, whose values are the ones applied (None for a PEFT directory)."""


def read_document(path: Path) -> tuple[AdapterSidecar, dict[str, dict[str, Any]]]:
    """The sidecar and the safetensors header of the adapter at ``path``, read and checked wholly, without torch."""
    document = open_document(path)
    return document.sidecar, document.header


def open_document(path: Path) -> AdapterFile:
    """The adapter at ``path`` read wholly (see :func:`read_adapter`), without torch.

    Refuses a steering artifact (by the cross-document sentence) and the sidecar given in place of
    the adapter file, naming the file to give instead.
    """
    if sidecar_path(path) == path:
        from ster.engine.model.adapters.artifact import read_sidecar

        read_sidecar(path)  # a steering artifact is named as one first
        raise Refusal(
            f"{path} is an adapter's sidecar; give the adapter file beside it, {path.with_suffix('.safetensors')}"
        )
    return read_adapter(path)


def accept(ctx: JobContext, sidecar: AdapterSidecar, checkpoint: Checkpoint, want: Want) -> None:
    """Refuse an adapter of the wrong kind or for another model; say the fingerprint note and the
    provenance warnings."""
    config = checkpoint.config
    note = check_for_model(
        sidecar, checkpoint.source.model, checkpoint.fingerprint, config.hidden_size, config.num_hidden_layers, want
    )
    if note is not None:
        ctx.log(note)
    for sentence in adapter_provenance(sidecar, checkpoint.request.precision, checkpoint.codec.decision):
        ctx.warn(sentence)


def check_adapter(
    ctx: JobContext, path: Path | None, checkpoint: Checkpoint, want: Want | None = "adapter"
) -> CheckedAdapter | None:
    """Every check of the adapter at ``path`` that needs no torch; None when no adapter was given.

    ``want`` None accepts either kind (the sidecar decides), for a command that reads both.
    """
    if path is None:
        return None
    if confine.readable(path).is_dir():
        return CheckedAdapter(path, None, want or "adapter")
    document = open_document(path)
    sidecar = document.sidecar
    kind: Want = want or sidecar.kind
    accept(ctx, sidecar, checkpoint, kind)
    check_tensors(sidecar, document.header, sidecar.expected_shapes(checkpoint.config), path)
    return CheckedAdapter(path, sidecar, kind, document)


def load_checked(
    ctx: JobContext, checked: CheckedAdapter, checkpoint: Checkpoint, device: torch.device
) -> tuple[AdapterSidecar, Adapter]:
    """The sidecar and factors (f32, finite, on ``device``) of an adapter :func:`check_adapter` passed."""
    if checked.document is None:
        return read_peft(ctx, checked.path, checkpoint.source.model, checkpoint.config, device, checked.want)
    from ster.engine.model.adapters.lora import adapter_of

    return checked.document.sidecar, adapter_of(checked.document, checkpoint.config, device)


def read_peft(
    ctx: JobContext, path: Path, model: str, config: DecoderConfig, device: torch.device, want: Want = "adapter"
) -> tuple[AdapterSidecar, Adapter]:
    """A PEFT adapter directory as a sidecar and factors, every factor's shape checked against ``config``.

    It records no fingerprint and no training run, so a base model of another name is said in a warning
    rather than refused, and there is nothing to warn about its provenance.
    """
    from ster.engine.model.adapters.peft_format import peft_model_note, read_peft_dir

    sidecar, adapter = read_peft_dir(path, config, device)
    note = peft_model_note(sidecar, model, want)
    if note is not None:
        ctx.warn(note)
    return sidecar, adapter


def open_adapter(
    ctx: JobContext, path: Path, checkpoint: Checkpoint, want: Want = "adapter", device: torch.device | None = None
) -> tuple[AdapterSidecar, Adapter]:
    """Check and read the adapter at ``path`` (a Ster adapter file or a PEFT directory) for ``checkpoint``."""
    from ster.engine.model.loading import resolve_device

    checked = check_adapter(ctx, path, checkpoint, want)
    assert checked is not None
    return load_checked(ctx, checked, checkpoint, device or resolve_device(checkpoint.request.device))


@contextmanager
def adapted(
    ctx: JobContext, decoder: Decoder, checked: CheckedAdapter | None, checkpoint: Checkpoint
) -> Iterator[Decoder]:
    """The decoder with the checked adapter's factors on its projections for the block; as it is when None."""
    from ster.engine.model.adapters.lora import attached

    adapter = None
    if checked is not None:
        _, adapter = load_checked(ctx, checked, checkpoint, decoder.lm_head.weight.device)
    with attached(decoder, adapter):
        yield decoder
