"""What an intervention does to the residual stream, per site, before any tensor exists.

Three modes act along a unit direction ``v`` of an artifact:

* ``add`` (steering): ``h ← h + s·v``, at the artifact's layers, ``s`` the strength at that layer;
* ``ablate`` (directional ablation): ``h ← h − w·(h·v)·v``, removing the component along ``v`` (all of it at
  weight ``w = 1``), by default at the embedding and in every block, as directional ablation does. Inside a
  block it is each *write* into the stream that loses its component (the attention's output and the MLP's,
  as they are added), so that with weight 1 the stream carries none of ``v`` before, inside and after every
  block, and the edit is exactly the change of weights ``W ← W − w·v·(vᵀW)`` of those writers (what ``bake``
  writes). A family that normalises each write before adding it (Gemma's sandwich norms, scale ``g``) has the
  write made orthogonal to ``g ⊙ v`` instead, so that the normalised write carries none of ``v``;
* ``clamp``: ``h ← h + w·(c − h·v)·v``, setting that component to the target ``c`` (moving it a fraction ``w``
  of the way there).

One formula holds all three: ``h ← h + w·(c − h·v)·v + a·v``. A *site* is where it applies: ``EMBEDDING`` (the
stream entering the first block) or a block's index (the stream after that block). A :data:`Plan` is one row's
edits, site by site; a batch of rows each carries its own plan, so one forward can hold a ladder of strengths,
or steering, ablation and clamping side by side.

The weight of an ablation or a clamp may follow a per-layer profile in the manner of heretic's: largest at a
peak layer, falling linearly to a minimum weight over a distance, and nothing beyond it. Nothing here imports
torch (see :mod:`ster.engine.steering.apply` for the hooks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import flag

Mode = Literal["add", "ablate", "clamp"]
MODES: tuple[Mode, ...] = ("add", "ablate", "clamp")
EMBEDDING = -1
"""The site before the first block: the embedding's output, the stream every block builds on."""


@dataclass(frozen=True)
class Edit:
    """One row's edit at one site: ``h ← h + weight·(target − h·direction)·direction + add·direction``."""

    direction: tuple[float, ...]
    """A unit vector of the model's width."""
    add: float = 0.0
    """How far along the direction to push (``add``), in the residual stream's units."""
    weight: float = 0.0
    """The fraction of the way the component along the direction moves to ``target`` (``ablate``, ``clamp``)."""
    target: float = 0.0
    """What the component along the direction is set to (0 for ``ablate``)."""
    on_writes: bool = False
    """Edit the block's writes rather than the stream after it: each of its two writes into the stream (the
    attention's and the MLP's) loses ``weight`` of its component along the direction, which is what an ablation
    does at a block (see the module's text)."""

    @property
    def projects(self) -> bool:
        """Whether the edit reads the stream's component along its direction (an ablation or a clamp)."""
        return self.weight != 0.0


Plan = dict[int, Edit]
"""One row's edits by site (:data:`EMBEDDING` or a block index); an empty plan is the unsteered model."""


def added(directions: dict[int, list[float]], scales: dict[int, float]) -> Plan:
    """The plan of steering (``add``): ``scales[layer] × directions[layer]`` after each listed block; a layer
    at scale 0 is left out, so strength 0 is the unsteered model exactly."""
    return {layer: Edit(tuple(directions[layer]), add=scale) for layer, scale in sorted(scales.items()) if scale != 0.0}


class Profile(BaseModel):
    """The weight of an ablation or a clamp at each site.

    Without a peak layer it is ``peak_weight`` everywhere. With one and a falloff, a site ``d`` layers from the
    peak (the embedding counts as layer −1) gets ``peak_weight + (d / falloff)·(min_weight − peak_weight)``
    while ``d ≤ falloff``, and nothing beyond (heretic's shape: ``max_weight``, ``max_weight_position``,
    ``min_weight``, ``min_weight_distance``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    peak_weight: float = 1.0
    peak_layer: float | None = None
    min_weight: float | None = None
    """The weight ``falloff`` layers from the peak (default: the peak weight, a flat profile)."""
    falloff: float | None = None
    """How many layers either side of the peak are edited (default: every layer)."""

    @model_validator(mode="after")
    def _check(self) -> Profile:
        for name in ("peak_weight", "peak_layer", "min_weight", "falloff"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{flag(name)} must be a finite number")
        if self.falloff is not None and self.falloff < 0:
            raise ValueError(f"{flag('falloff')} must be 0 or more layers")
        if self.peak_layer is None and (self.min_weight is not None or self.falloff is not None):
            raise ValueError(
                f"{flag('min_weight')} and {flag('falloff')} shape the weight around a peak: give "
                f"{flag('peak_layer')} too"
            )
        if self.min_weight is not None and self.falloff is None:
            raise ValueError(
                f"{flag('min_weight')} is the weight {flag('falloff')} layers from the peak: give {flag('falloff')} too"
            )
        return self

    def weight(self, site: int) -> float:
        """The weight at ``site`` (0 where the profile leaves it alone)."""
        if self.peak_layer is None:
            return self.peak_weight
        distance = abs(site - self.peak_layer)
        if self.falloff is not None and distance > self.falloff:
            return 0.0
        if not self.falloff:  # every layer at the peak weight, or (falloff 0) the peak alone
            return self.peak_weight
        low = self.peak_weight if self.min_weight is None else self.min_weight
        return self.peak_weight + (distance / self.falloff) * (low - self.peak_weight)

    @property
    def shaped(self) -> bool:
        """Whether the profile is other than a weight of 1 everywhere."""
        return self.peak_layer is not None or self.peak_weight != 1.0


def sites(mode: Mode, layers: list[int] | None, artifact_layers: list[int], block_count: int) -> list[int]:
    """Where ``mode`` applies: steering at the artifact's layers; ablation and clamping at the embedding and
    after every block. ``layers`` (``--layers``) narrows either to the blocks it names."""
    if mode == "add":
        if layers is None:
            return sorted(artifact_layers)
        missing = sorted(set(layers) - set(artifact_layers))
        if missing:
            raise Refusal(
                f"{flag('layers')} names layer {missing[0]}, where the artifact has no direction to add "
                f"(it has layers {', '.join(map(str, sorted(artifact_layers)))})"
            )
        return sorted(layers)
    return [EMBEDDING, *range(block_count)] if layers is None else sorted(layers)


def source_layer(directions: dict[int, list[float]], site: int, direction_layer: int | None = None) -> int:
    """The artifact layer whose direction is used at ``site``: ``direction_layer`` when one is named; else the
    site's own layer where the artifact has one, or its nearest layer (the lower one of two as near; the
    embedding takes the lowest)."""
    if direction_layer is not None:
        return direction_layer
    return min(directions, key=lambda layer: (abs(layer - site), layer))


def projecting(
    directions: dict[int, list[float]],
    where: list[int],
    profile: Profile,
    direction_layer: int | None = None,
    *,
    weight: float = 1.0,
    targets: dict[int, float] | None = None,
) -> Plan:
    """The plan of an ablation, or with ``targets`` (per artifact layer, in the residual stream's units) a clamp, at
    each site of ``where``: the profile's weight there times ``weight`` (1 removes, or sets, the whole component)."""
    plan: Plan = {}
    for site in where:
        layer = source_layer(directions, site, direction_layer)
        amount = profile.weight(site) * weight
        if amount != 0.0:
            target = 0.0 if targets is None else targets[layer]
            writes = targets is None and site != EMBEDDING  # an ablation inside a block edits its writes
            plan[site] = Edit(tuple(directions[layer]), weight=amount, target=target, on_writes=writes)
    return plan
