"""Requests of the steering jobs: generate, extract, train, optimize, evaluate, sweep, inspect."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, field_validator, model_validator

from ster.engine.model.adapters.artifact import sidecar_path
from ster.engine.model.requests import ModelRequest, SampledRequest
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import same_file
from ster.engine.protocol.requests import Request, at_least_one, seed
from ster.engine.steering.intervention import Mode, Profile
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.strength import (
    DEFAULT_KL_BUDGET,
    DEFAULT_STRENGTH,
    DEFAULT_SWEEP,
    DEFAULT_TRIALS,
    Strength,
    parse_strengths,
)


class InterventionFields(BaseModel):
    """How an artifact's direction is applied: added (steering), ablated or clamped, where, and how strongly
    at each site (see :mod:`ster.engine.steering.intervention`)."""

    mode: Mode = "add"
    """``add`` steers at the artifact's layers; ``ablate`` removes the component along the direction and
    ``clamp`` sets it to the strength, at the embedding and after every block."""
    layers: str | None = None
    """Narrows where the mode applies to these blocks (``all``, ``2,5``, ``2..6``); None: the mode's default."""
    direction_layer: int | None = None
    """Ablate and clamp with the artifact's direction at this layer at every site (default: each site takes
    the direction of the artifact's nearest layer)."""
    peak_weight: float = 1.0
    """The weight of an ablation or a clamp at its peak (everywhere, without ``peak_layer``)."""
    peak_layer: float | None = None
    """Where the weight peaks; with ``falloff`` it falls linearly to ``min_weight`` and stops beyond."""
    min_weight: float | None = None
    falloff: float | None = None
    """Layers either side of the peak that are edited."""

    @model_validator(mode="after")
    def _intervention(self) -> InterventionFields:
        self.profile  # noqa: B018  (checks the profile's fields, in their sentences)
        if self.layers is not None:
            LayerSpec.parse(self.layers)
        if self.direction_layer is not None and self.direction_layer < 0:
            raise ValueError(f"{flag('direction_layer')} must be a layer index, 0 or more")
        if self.mode == "add" and (self.direction_layer is not None or self.profile.shaped):
            raise ValueError(
                f"{flag('direction_layer')} and the weight profile ({flag('peak_weight')}, {flag('peak_layer')}, "
                f"{flag('min_weight')}, {flag('falloff')}) shape an ablation or a clamp; give {flag('mode')} "
                "ablate or clamp"
            )
        return self

    @property
    def profile(self) -> Profile:
        return Profile(
            peak_weight=self.peak_weight, peak_layer=self.peak_layer, min_weight=self.min_weight, falloff=self.falloff
        )


class GenerateRequest(SampledRequest, InterventionFields):
    """``ster generate``: autoregressive decoding from one prompt, steered when given a vector."""

    prompt: str
    vector: Path | None = None
    """A steering artifact; without one the run is the unsteered baseline."""
    strength: Strength | None = None
    """How far along every direction of the artifact: ``3`` in the residual stream's units, or ``0.4x``
    times each layer's activation norm; negative steers the other way. None (not given) is
    ``DEFAULT_STRENGTH``; a strength given without a vector is warned about."""
    max_new_tokens: int | None = None
    """Most tokens to generate; None means up to ``default_max_new_tokens``, as many as the model's
    context leaves room for (an explicit value that runs past the context is refused)."""
    default_max_new_tokens: ClassVar[int] = 128
    none_means: ClassVar[dict[str, str]] = {"strength": DEFAULT_STRENGTH}
    """What a field left None stands for, as a front end shows its default."""
    adapter: Path | None = None
    """A LoRA adapter (or a PEFT adapter directory) attached while generating; combinable with ``vector``."""

    _tokens = field_validator("max_new_tokens")(lambda cls, v: _budget(v))

    @model_validator(mode="after")
    def _mode_strength(self) -> GenerateRequest:
        if self.strength is not None:
            mode_strengths(self.mode, [self.strength], "strength")
        return self


def mode_strengths(mode: Mode, strengths: list[Strength], field: str) -> list[Strength]:
    """An ablation's strength is the weight of the projection removed: a plain number of at least 0 (1 removes
    the whole component), never a multiple of a layer's unit."""
    if mode == "ablate":
        for strength in strengths:
            if strength.value and (strength.unit == "relative" or strength.value < 0):  # 0 is 0 in either unit
                raise ValueError(
                    f"{flag(field)} {strength} is not a weight: with {flag('mode')} ablate a strength is the share of "
                    "the component removed, a number of at least 0 (1 removes all of it)"
                )
    return strengths


class AdaptedRequest(ModelRequest):
    """A steering command that may read an adapted model: the adapter attached around every forward."""

    adapter: Path | None = None
    """A LoRA adapter file (its sidecar beside it) or a PEFT adapter directory; None reads the bare checkpoint."""

    @model_validator(mode="after")
    def _sidecar_not_written(self) -> AdaptedRequest:
        """The adapter's sidecar is an input too, though no field names it: an output must not replace it."""
        if self.adapter is None:
            return self
        side = sidecar_path(self.adapter)
        for name in self.outputs:
            value = getattr(self, name, None)
            if isinstance(value, Path) and same_file(value, side):
                raise ValueError(
                    f"{flag(name)} {value} is the sidecar of {flag('adapter')} {self.adapter}, so writing it "
                    f"would destroy the adapter's description; give {flag(name)} another path"
                )
        return self


class LayeredRead(AdaptedRequest):
    """A read at selected layers, in batches, that writes one document."""

    output: Path
    layers: str = "all"
    batch_size: int = 8
    """Sequences (prompts, or pairs) read per forward pass; results equal one-at-a-time reads."""

    _layers = field_validator("layers")(lambda cls, v: _layer_spec(v))
    _batch = field_validator("batch_size")(lambda cls, v: at_least_one(v, "batch_size"))


class ExtractRequest(LayeredRead):
    """``ster extract``: last-token residual states after selected blocks, for a prompt set."""

    input: Path
    """A JSON document ``{"prompts": ["...", ...]}``."""


class OptimizeRequest(LayeredRead):
    """``ster optimize``: every method at every selected layer ranked on an ordered holdout."""

    pairs: Path | None = None
    """The pair set; the workspace's active set when omitted."""


class TrainRequest(OptimizeRequest):
    """``ster train``: one direction per selected layer, written as a steering artifact."""

    method: Literal["caa", "pca", "logistic"] = "caa"


class EvaluateRequest(AdaptedRequest):
    """``ster evaluate``: an artifact's accuracy and margin on a pair set."""

    pairs: Path | None = None
    """The pair set; the workspace's active set when omitted."""
    vector: Path
    batch_size: int = 8

    _batch = field_validator("batch_size")(lambda cls, v: at_least_one(v, "batch_size"))


def kl_budget(value: float) -> float:
    """A KL budget: a finite number above 0."""
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{flag('kl_budget')} must be a number above 0 (nats per token); got {value:g}")
    return value


class SweepRequest(SampledRequest, InterventionFields):
    """``ster sweep``: steered text, effect and degeneracy at each strength."""

    vector: Path
    prompts: Path | None = None
    """A JSON document ``{"prompts": [...]}``."""
    prompt_texts: list[str] | None = None
    """The prompts themselves, instead of a file (exactly one of the two)."""
    strengths: list[Strength] | None = None
    """Absolute or relative (``0.4x``), all in one unit; 0 is always added, and they are swept in order.
    None (not given) is half, once and twice a calibrated artifact's strength of each sign, or else
    ``DEFAULT_SWEEP``: relative either way, so it scales with the artifact's activation spread."""
    max_new_tokens: int | None = None
    """Most tokens per text; None means up to ``default_max_new_tokens``, as the context allows."""
    default_max_new_tokens: ClassVar[int] = 48
    none_means: ClassVar[dict[str, str]] = {"strengths": DEFAULT_SWEEP}
    """What a field left None stands for, as a front end shows its default (a calibrated artifact's walk
    comes first; the help names it in words)."""
    adapter: Path | None = None
    """A LoRA adapter attached while generating and re-reading the texts."""

    neutral: Path | None = None
    """Everyday prompts the cost (KL from the unsteered model) of each strength is measured on; None is
    ``ster:neutral``. At most ``neutral_count`` of them, spread evenly through the set, are used."""
    neutral_count: int = 16
    """How many of the neutral prompts the KL is measured on: a sweep is a quick look (``calibrate`` uses all)."""
    holdout: Path | None = None
    """Held-out pairs whose behaviour (log p(positive side) − log p(negative side)) is measured per strength;
    None measures no behaviour."""
    kl_budget: float = DEFAULT_KL_BUDGET
    """The mean KL a strength may cost to be suggested by the budget."""

    _count = field_validator("neutral_count")(lambda cls, v: at_least_one(v, "neutral_count"))
    _tokens = field_validator("max_new_tokens")(lambda cls, v: _budget(v))
    _kl_budget = field_validator("kl_budget")(lambda cls, v: kl_budget(v))

    @field_validator("strengths", mode="before")
    @classmethod
    def _parse(cls, raw: object) -> list[Strength] | None:
        return None if raw is None else parse_strengths(raw)

    @field_validator("strengths")
    @classmethod
    def _strengths(cls, values: list[Strength] | None) -> list[Strength] | None:
        return None if values is None else sweep_strengths(values)

    @model_validator(mode="after")
    def _mode_strengths(self) -> SweepRequest:
        if self.strengths is not None:
            mode_strengths(self.mode, self.strengths, "strengths")
        return self


def sweep_strengths(values: list[Strength]) -> list[Strength]:
    """A sweep's strengths in one unit, ascending, each once, with 0 added."""
    if not values:
        raise ValueError(f"{flag('strengths')} needs at least one strength")
    units = {value.unit for value in values if value.value != 0}
    if len(units) > 1:
        raise ValueError(
            f"{flag('strengths')} mixes absolute and relative strengths; give all of them as numbers "
            "(3) or all as multiples of the activation spread (0.4x)"
        )
    unit = units.pop() if units else "absolute"
    return [Strength(value=v, unit=unit) for v in sorted({value.value for value in values} | {0.0})]


class CalibrateRequest(AdaptedRequest):
    """``ster calibrate``: layer, method and strength per sign, searched for the strongest held-out behaviour
    within a KL budget on a neutral prompt set."""

    pairs: Path | None = None
    """The pair set the directions are fitted on; the workspace's active set when omitted."""
    holdout: Path | None = None
    """Pairs to measure behaviour on; without it the last 20% of ``pairs`` are held out from fitting."""
    neutral: Path | None = None
    """Everyday prompts the cost (KL from the unsteered model) is measured on; None is ``ster:neutral``."""
    kl_budget: float = DEFAULT_KL_BUDGET
    """Most mean KL (nats per token, over the continuation) a chosen strength may cost on the neutral set."""
    trials: int = DEFAULT_TRIALS
    """Candidates (a layer or contiguous layer range, and a method) the search measures, each at a ladder of
    strengths of both signs."""
    seed: int = 0
    """Picks the neutral prompts and held-out pairs the search screens on (the final point is measured on all)."""
    layers: str = "all"
    output: Path
    resume: bool = False
    """Continue the study an interrupted run left beside ``output``."""
    batch_size: int = 8
    judge: str | None = None
    """A local instruct model asked whether each answer shows the trait; None is the model itself where it has a
    chat template, ``none`` runs no judge."""
    judge_question: str | None = None
    """The judge's question, with ``{text}`` (and optionally ``{trait}``); None is the default question."""
    mode: Literal["add", "ablate"] = "add"
    """``add`` calibrates steering (layers, method, strength per sign); ``ablate`` calibrates an ablation (the
    direction's layer and the weight profile) against the share of held-out trait prompts refused."""
    refusal_markers: Path | None = None
    """With ``ablate``: the refusal judge's markers, a JSON list of phrases (default: the built-in list)."""

    _layers = field_validator("layers")(lambda cls, v: _layer_spec(v))
    _batch = field_validator("batch_size")(lambda cls, v: at_least_one(v, "batch_size"))
    _trials = field_validator("trials")(lambda cls, v: at_least_one(v, "trials"))

    _kl_budget = field_validator("kl_budget")(lambda cls, v: kl_budget(v))

    _seed = field_validator("seed")(lambda cls, v: seed(v))


Format = Literal["checkpoint", "lora", "llama-cpp", "lm-eval"]
FORMAT_MODES: dict[str, tuple[Mode, ...]] = {
    "checkpoint": ("add", "ablate"),
    "lora": ("ablate",),
    "llama-cpp": ("add",),
    "lm-eval": ("add", "ablate", "clamp"),
}
"""What each bake format can carry: llama.cpp's control vectors only add; a LoRA is a change of weights, which
holds an ablation but no constant; lm-eval's steered model adds and clamps."""


class BakeRequest(ModelRequest, InterventionFields):
    """``ster bake``: an artifact's direction, added or ablated, written as a checkpoint, a LoRA, a llama.cpp
    control vector or lm-eval's steering file."""

    directory_outputs: ClassVar[tuple[str, ...]] = ("output",)
    """A directory for checkpoint and lora, a file for the others: the job checks which."""
    vector: Path
    strength: Strength | None = None
    """As generate takes it: the strength added (default: calibrated, else ``DEFAULT_STRENGTH``), the weight of
    an ablation (default 1), the target of a clamp."""
    format: Format = "checkpoint"
    output: Path
    none_means: ClassVar[dict[str, str]] = {"strength": DEFAULT_STRENGTH}

    @model_validator(mode="after")
    def _bake(self) -> BakeRequest:
        carried = FORMAT_MODES[self.format]
        if self.mode not in carried:
            others = [name for name, modes in FORMAT_MODES.items() if self.mode in modes]
            raise ValueError(
                f"{flag('format')} {self.format} carries {' and '.join(carried)} only, not {self.mode}; "
                f"{' or '.join(others)} carries it"
            )
        if self.strength is not None:
            mode_strengths(self.mode, [self.strength], "strength")
        return self


class VectorImportRequest(ModelRequest):
    """``ster vector import``: a llama.cpp or repeng control-vector GGUF read into a steering artifact for
    ``model``."""

    control_vector: Path
    output: Path
    trait_name: str | None = None
    """The artifact's trait (default: the file's name)."""


class InspectRequest(Request):
    """``ster inspect``: validate and summarise an artifact without loading a model."""

    artifact: Path


def _budget(value: int | None) -> int | None:
    return value if value is None else at_least_one(value, "max_new_tokens")


def _layer_spec(value: str) -> str:
    try:
        LayerSpec.parse(value)
    except Refusal as exc:
        raise ValueError(str(exc)) from None
    return value
