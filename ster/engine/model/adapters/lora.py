"""LoRA factors on the decoder's projections: drawn fresh, loaded from an artifact, attached, written.

An :class:`Adapter` owns its tensors (f32 parameters, whatever the base's precision)
and never a copy of the base. :func:`attached` puts them on the decoder's projections
for the length of a ``with`` block and takes them off in ``finally``, so the decoder a
model store shares between jobs is never left adapted; inside the block a forward with
``adapters=False`` is the frozen base, which is how DPO scores its reference.

A fresh adapter draws every A from N(0, (1/rank)²) with the run's own seeded generator,
in a fixed order (layer, then target), and sets every B to zero: the update ``scale · B A``
is exactly zero, so a fresh adapter is the identity, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from ster.engine.model.adapters.artifact import (
    REWARD_HEAD,
    TARGETS,
    AdapterSidecar,
    check_fields,
    check_tensors,
    factor_names,
    projection_shape,
    sidecar_path,
)
from ster.engine.model.adapters.factors import FactorHost, LoraFactors
from ster.engine.model.adapters.file import AdapterFile, check_values, digest, read_adapter
from ster.engine.model.config import DecoderConfig
from ster.engine.model.contract import Decoder
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import dumps_pretty, write_atomic_together
from ster.engine.protocol.tensorfile import parse


@dataclass
class Adapter:
    """LoRA factors (and a reward run's head) as f32 tensors, named as the artifact names them."""

    rank: int
    alpha: float
    targets: list[str]
    layers: list[int]
    tensors: dict[str, Tensor] = field(default_factory=dict)
    """``layers.{l}.{t}.a`` / ``.b``, and ``reward.head`` for a reward model, in a fixed order."""

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def head(self) -> Tensor | None:
        return self.tensors.get(REWARD_HEAD)

    @classmethod
    def fresh(
        cls,
        config: DecoderConfig,
        rank: int,
        alpha: float,
        targets: list[str],
        layers: list[int],
        seed: int,
        device: torch.device,
        reward: bool = False,
    ) -> Adapter:
        """A drawn from N(0, (1/rank)²) by a generator seeded with ``seed``, B zero: the identity."""
        generator = torch.Generator().manual_seed(seed)
        tensors: dict[str, Tensor] = {}
        for layer in layers:
            for target in targets:
                out, inner = projection_shape(config, target)
                a, b = factor_names(layer, target)
                tensors[a] = torch.randn(rank, inner, generator=generator, dtype=torch.float32) / rank
                tensors[b] = torch.zeros(out, rank, dtype=torch.float32)
        if reward:
            tensors[REWARD_HEAD] = torch.zeros(1, config.hidden_size, dtype=torch.float32)
        adapter = cls(rank, float(alpha), list(targets), sorted(set(layers)), tensors)
        return adapter.to(device)

    def to(self, device: torch.device) -> Adapter:
        self.tensors = {name: nn.Parameter(t.to(device), requires_grad=False) for name, t in self.tensors.items()}
        return self

    def trainable(self) -> list[Tensor]:
        """Every tensor, switched to require gradients, in the artifact's order (what the optimizer steps)."""
        for tensor in self.tensors.values():
            tensor.requires_grad_(True)
        return list(self.tensors.values())

    def parameter_count(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    def state(self) -> dict[str, Tensor]:
        """Contiguous CPU copies of the tensors, for writing."""
        return {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in self.tensors.items()}


@contextmanager
def attached(decoder: Decoder, adapter: Adapter | None) -> Iterator[Decoder]:
    """The decoder with ``adapter``'s factors, and only them, on its projections for the block; as it is when
    None. Factors attached before (GRPO's policy, while its reward model scores) are set aside and put back."""
    if adapter is None:
        yield decoder
        return
    entries = []
    for layer in adapter.layers:
        for target in adapter.targets:
            a, b = factor_names(layer, target)
            host = decoder.lora_module(layer, TARGETS[target])
            entries.append((host, TARGETS[target], LoraFactors(adapter.tensors[a], adapter.tensors[b], adapter.scale)))
    with factors_on(decoder, entries):
        yield decoder


@contextmanager
def factors_on(decoder: Decoder, entries: list[tuple[FactorHost, str, LoraFactors]]) -> Iterator[None]:
    """Exactly ``entries`` (module, projection, factors) attached for the block; what was attached before is set
    aside and put back whatever happens."""
    modules = lora_modules(decoder)
    before = [dict(module.lora) for module in modules]
    try:
        for module in modules:
            module.lora.clear()
        for host, name, factors in entries:
            host.lora[name] = factors
        yield
    finally:
        for module, kept in zip(modules, before, strict=True):
            module.lora.clear()
            module.lora.update(kept)


@contextmanager
def folded(decoder: Decoder) -> Iterator[Decoder]:
    """The decoder with its attached LoRA updates folded into copies of the weights they change (``W + scale·BA``)
    and no factors attached, for the block; as it was after. For sampling from the adapted policy: a decode
    step then costs what the base's does, where attached factors add two small matmuls per adapted projection
    per step. The copies hold the same function, rounded differently, so nothing that needs the attached
    arithmetic bit for bit (a training forward, its reference) belongs inside. Quantized weights keep their
    factors attached."""
    saved: list[Folded] = []
    try:
        with torch.no_grad():
            for module in lora_modules(decoder):
                if module.lora and _fold(module, saved):
                    module.lora = {}
        yield decoder
    finally:
        for module, lora, fused, weights in reversed(saved):
            module.lora, module.fused_weight = lora, fused
            for name, weight in weights.items():
                getattr(module, name).weight = weight


def lora_modules(decoder: Decoder) -> list[FactorHost]:
    """Every module of the decoder's blocks that LoRA factors attach to (each block's attention and MLP)."""
    return [
        cast(FactorHost, module)
        for block in decoder.blocks
        for module in (getattr(block, "self_attn", None), getattr(block, "mlp", None))
        if module is not None and hasattr(module, "lora")
    ]


Folded = tuple[FactorHost, dict[str, LoraFactors], Tensor | None, dict[str, Tensor]]
"""A module whose factors were folded: its factors, its fused weight and its projections' weights before."""


def _fold(module: FactorHost, saved: list[Folded]) -> bool:
    """Fold ``module``'s attached factors into copies of its weights (its fused q/k/v or gate/up weight
    included, whose leading rows its first projections' weights are views of); False, changing nothing,
    when a weight is not a plain tensor or the fused layout is not that."""
    linears = [(name, child) for name, child in module.named_children() if isinstance(child, nn.Linear)]
    if any(type(child.weight) not in (nn.Parameter, Tensor) for _, child in linears):
        return False
    if set(module.lora) - {name for name, _ in linears}:  # a piece of a fused projection (transformers' Phi-3)
        return False
    fused: Tensor | None = module.fused_weight
    in_fused: dict[str, int] = {}
    if fused is not None:
        start = 0
        for name, child in linears:
            if start == fused.shape[0]:
                break
            if child.weight.data_ptr() != fused[start].data_ptr():
                return False
            in_fused[name] = start
            start += child.out_features
    weights = {name: child.weight for name, child in linears}
    saved.append((module, module.lora, fused, weights))
    new_fused = None if fused is None or not (in_fused.keys() & module.lora.keys()) else fused.clone()
    for name, child in linears:
        if new_fused is not None and name in in_fused:
            rows = new_fused[in_fused[name] : in_fused[name] + child.out_features]
            if name in module.lora:
                rows.copy_(_folded_weight(rows, module.lora[name]))
            child.weight = nn.Parameter(rows, requires_grad=False)
        elif name in module.lora:
            child.weight = nn.Parameter(_folded_weight(child.weight, module.lora[name]), requires_grad=False)
    if new_fused is not None:
        module.fused_weight = new_fused
    return True


def _folded_weight(weight: Tensor, lora: LoraFactors) -> Tensor:
    return (weight.float() + lora.scale * (lora.b.detach() @ lora.a.detach())).to(weight.dtype)


def load_adapter(path: Path, config: DecoderConfig, device: torch.device) -> tuple[AdapterSidecar, Adapter]:
    """Read an adapter artifact wholly (:func:`read_adapter`) and check it against the model's shapes."""
    document = read_adapter(path)
    return document.sidecar, adapter_of(document, config, device)


def adapter_of(document: AdapterFile, config: DecoderConfig, device: torch.device) -> Adapter:
    """The factors of a checked adapter file as f32 tensors on ``device``, every tensor shaped as the
    sidecar and the model imply (the values were checked when the file was read)."""
    sidecar = document.sidecar
    expected = sidecar.expected_shapes(config)
    check_tensors(sidecar, document.header, expected, document.path)
    tensors = {name: torch.from_numpy(np.array(document.floats(name), dtype=np.float32)) for name in expected}
    return Adapter(sidecar.rank, sidecar.alpha, sidecar.targets, sidecar.layers, tensors).to(device)


def adapter_bytes(adapter: Adapter) -> bytes:
    """The safetensors file of an adapter, checked finite first."""
    from safetensors.torch import save

    state = adapter.state()
    for name, tensor in state.items():
        if not torch.isfinite(tensor).all():
            raise Refusal(f"adapter tensor {name} contains a non-finite value, so the adapter is not written")
    return save(state)


def save_adapter(path: Path, sidecar: AdapterSidecar, adapter: Adapter, config: DecoderConfig) -> None:
    """Validate the pair as a reader would, then write both files atomically, together, the sidecar
    recording the hash of the tensors' bytes.

    The sidecar is renamed into place first: a kill between the two renames then leaves the new sidecar
    beside the old tensors (or beside none), which its hash refuses; the other order could leave the old
    sidecar of an adapter written before the hash existed beside new tensors, which nothing could tell."""
    data = adapter_bytes(adapter)
    header = {name: {"shape": list(t.shape)} for name, t in adapter.state().items()}
    check_tensors(sidecar, header, sidecar.expected_shapes(config), path)
    try:
        check_values(sidecar, parse(data))  # what a reader would refuse is not written
    except Refusal as exc:
        raise Refusal(f"{exc}, so the adapter is not written") from None
    document = sidecar.model_copy(update={"tensors_sha256": digest(data)}).model_dump(mode="json")
    check_fields(AdapterSidecar.model_validate(document), sidecar_path(path))
    write_atomic_together([(sidecar_path(path), dumps_pretty(document)), (path, data)])
