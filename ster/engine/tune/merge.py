"""The ``tune merge`` job: an adapter folded into a copy of the checkpoint's weights.

It writes an ordinary checkpoint directory — ``model.safetensors`` beside the source's
own config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja and
generation_config.json (those present) — that any Llama loader reads; the output is
deliberately not a Ster format. No decoder is built: the source's safetensors are read
tensor by tensor, and each adapted projection ``W`` becomes ``W + (alpha / rank) · B @ A``,
accumulated in f32 and cast back to ``W``'s own dtype; every other tensor is copied as it is.

Everything that can be refused is refused before torch is imported: the model (its family,
its files), a sharded source that names one tensor twice (refused rather than half-merged),
the adapter (its sidecar and tensor shapes, its kind — a reward model has nothing to merge —
and the model and width it was trained for), and the output directory (new, or empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ster.engine.model.adapters.apply import read_document, read_peft
from ster.engine.model.adapters.artifact import (
    ATTENTION,
    TARGETS,
    AdapterSidecar,
    check_for_model,
    check_tensors,
    factor_names,
    projection_shape,
)
from ster.engine.model.checkpoint_files import WEIGHTS, copy_checkpoint_files, shard_headers
from ster.engine.model.config import DecoderConfig, decoder_name, fused_rows, load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.resolve import ModelSource, resolve_model
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import atomic_directory, check_output_directory
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.requests import MergeRequest

if TYPE_CHECKING:
    from ster.engine.model.adapters.lora import Adapter


class MergeReport(BaseModel):
    model: str
    model_revision: str | None
    adapter: str
    output: str
    rank: int
    alpha: float
    scale: float
    """alpha / rank: the factor of every folded update."""
    targets: list[str]
    layers: list[int]
    hidden_size: int
    merged_tensors: int
    """Projections whose weight now includes the adapter's update."""
    copied_tensors: int
    total_tensors: int
    parameters: int
    dtype: str
    """The safetensors dtype of the adapted weights, which the merged ones keep (``F32``, ``BF16``, …)."""
    files: list[str]
    """What the output directory holds."""


class MergeResult(BaseModel):
    """What ``tune merge`` prints."""

    report: MergeReport


def weight_name(layer: int, target: str) -> str:
    """The checkpoint tensor a target's adapter updates: ``model.layers.{l}.self_attn.q_proj.weight`` and so on."""
    module = "self_attn" if target in ATTENTION else "mlp"
    return f"model.layers.{layer}.{module}.{TARGETS[target]}.weight"


def weight_rows(config: DecoderConfig, layer: int, target: str) -> tuple[str, int, int, int]:
    """The checkpoint tensor a target's adapter updates, the rows of it that are the target's, and its row count:
    all of a tensor of its own, a slice of a family's fused projection (Phi-3's ``qkv_proj``, ``gate_up_proj``)."""
    projection = TARGETS[target]
    module = "self_attn" if target in ATTENTION else "mlp"
    for fused, parts in config.family.fused.items():
        if projection in parts:
            rows = [fused_rows(config, part) for part in parts]
            start = sum(rows[: parts.index(projection)])
            return (
                f"model.layers.{layer}.{module}.{fused}.weight",
                start,
                start + rows[parts.index(projection)],
                sum(rows),
            )
    out = projection_shape(config, target)[0]
    return weight_name(layer, target), 0, out, out


def merge_job(request: MergeRequest, ctx: JobContext) -> MergeResult:
    ctx.progress("resolve", f"resolving model {request.model}")
    source = resolve_model(request.model, request.revision)
    if source.warning:
        ctx.warn(source.warning)
    config = load_config(source.config)
    fingerprint = checkpoint_fingerprint(config, source.weights)
    shards = shard_headers(source.weights)
    sidecar = None
    if not confine.readable(request.adapter).is_dir():  # a PEFT directory is checked once it is read, below
        sidecar, header = read_document(request.adapter)
        _check_adapter(ctx, sidecar, source, fingerprint, config)
        check_tensors(sidecar, header, sidecar.expected_shapes(config), request.adapter)
        _check_weights(sidecar, shards, config)
    check_output_directory(request.output)
    # torch, once every input has been checked
    from ster.engine.model.loading import resolve_device

    device = resolve_device(request.device)
    sidecar, adapter = _read_adapter(ctx, request.adapter, sidecar, source, config, device, shards)
    with atomic_directory(request.output) as staging:
        merged, dtypes, parameters = _write_weights(ctx, source, shards, adapter, staging / WEIGHTS, device, config)
        files = [WEIGHTS, *copy_checkpoint_files(source, staging)]
    ctx.log(f"merged {len(merged)} projections into {request.output}")
    return MergeResult(
        report=MergeReport(
            model=source.model,
            model_revision=source.revision,
            adapter=str(request.adapter),
            output=str(request.output),
            rank=sidecar.rank,
            alpha=sidecar.alpha,
            scale=sidecar.scale,
            targets=sidecar.targets,
            layers=sidecar.layers,
            hidden_size=sidecar.hidden_size,
            merged_tensors=len(merged),
            copied_tensors=len(shards) - len(merged),
            total_tensors=len(shards),
            parameters=parameters,
            dtype=",".join(sorted(dtypes)),
            files=sorted(files),
        )
    )


def _check_adapter(
    ctx: JobContext, sidecar: AdapterSidecar, source: ModelSource, fingerprint: str, config: DecoderConfig
) -> None:
    note = check_for_model(sidecar, source.model, fingerprint, config.hidden_size, config.num_hidden_layers)
    if note is not None:
        ctx.log(note)


def _check_weights(
    sidecar: AdapterSidecar, shards: dict[str, tuple[Path, dict[str, Any]]], config: DecoderConfig
) -> None:
    """Every weight the adapter updates is in the checkpoint, shaped as the adapter's factors multiply to."""
    in_checkpoint = {decoder_name(config, name): name for name in shards}
    for layer in sidecar.layers:
        for target in sidecar.targets:
            name, _, _, rows = weight_rows(config, layer, target)
            name = in_checkpoint.get(name, name)
            shape = [rows, projection_shape(config, target)[1]]
            if name not in shards:
                raise Refusal(f"the weights of {sidecar.model} have no tensor {name}, which the adapter updates")
            if list(shards[name][1].get("shape", [])) != shape:
                raise Refusal(
                    f"tensor {name} has shape {shards[name][1].get('shape')}, but the adapter's update is "
                    f"shaped {shape}"
                )


def _read_adapter(
    ctx: JobContext,
    path: Path,
    sidecar: AdapterSidecar | None,
    source: ModelSource,
    config: DecoderConfig,
    device: Any,
    shards: dict[str, tuple[Path, dict[str, Any]]],
) -> tuple[AdapterSidecar, Adapter]:
    """The factors of a checked Ster adapter, or of a PEFT directory (read, then checked)."""
    if sidecar is None:
        sidecar, adapter = read_peft(ctx, path, source.model, config, device)
        _check_weights(sidecar, shards, config)
        return sidecar, adapter
    from ster.engine.model.adapters.lora import load_adapter

    return load_adapter(path, config, device)


def _write_weights(
    ctx: JobContext,
    source: ModelSource,
    shards: dict[str, tuple[Path, dict[str, Any]]],
    adapter: Adapter,
    target: Path,
    device: Any,
    config: DecoderConfig,
) -> tuple[list[str], set[str], int]:
    """Write every tensor of the source into one file, the adapted projections with their update folded in;
    return the merged names, the merged weights' dtypes and the parameter count."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    updates: dict[str, list[tuple[int, int, tuple[str, str]]]] = {}
    for layer in adapter.layers:
        for short in adapter.targets:
            name, start, stop, _ = weight_rows(config, layer, short)
            updates.setdefault(name, []).append((start, stop, factor_names(layer, short)))
    state: dict[str, torch.Tensor] = {}
    merged, dtypes = [], set()
    for number, path in enumerate(source.weights, start=1):
        ctx.check_cancelled()
        ctx.progress("merge", f"reading {path.name} ({number}/{len(source.weights)})", number, len(source.weights))
        with safe_open(str(path), framework="pt", device="cpu") as weights:
            for name in weights.keys():
                tensor = weights.get_tensor(name)
                update = updates.get(decoder_name(config, name) or name)
                if update is not None:
                    folded = tensor.to(device, torch.float32, copy=True)  # [out, in] f32
                    for start, stop, factors in update:
                        a, b = (adapter.tensors[factor].detach().to(device, torch.float32) for factor in factors)
                        folded[start:stop] += adapter.scale * (b @ a)
                    tensor = folded.to(tensor.dtype).cpu()
                    merged.append(name)
                    dtypes.add(str(shards[name][1].get("dtype")))
                state[name] = tensor.contiguous()
    save_file(state, str(target), metadata={"format": "pt"})
    return merged, dtypes, sum(t.numel() for t in state.values())
