"""The ``generate`` job: decode from one prompt, steered when given an artifact, one token event per token."""

from __future__ import annotations

import time
from typing import TypeVar

from pydantic import BaseModel

from ster.engine.model.adapters.apply import adapted, check_adapter
from ster.engine.model.context import encode_within, generation_budget
from ster.engine.model.loading import model_store
from ster.engine.model.sampling import Sampling, StopReason
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag
from ster.engine.steering.artifact import SteeringArtifact, open_artifact
from ster.engine.steering.intervention import EMBEDDING, Mode, Plan, added, projecting, sites
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.requests import BakeRequest, GenerateRequest, InterventionFields
from ster.engine.steering.strength import DEFAULT_STRENGTH, Strength, Unit, excess_warning


class GenerateResult(BaseModel):
    """What ``ster generate`` prints."""

    model: str
    model_revision: str | None
    prompt: str
    text: str
    tokens: int
    """Generated tokens, not counting the EOS that ended the text."""
    prompt_tokens: int
    stop_reason: StopReason
    chat_template: str
    precision: str
    temperature: float
    top_p: float | None
    seed: int
    max_new_tokens: int
    vector: str | None
    """The steering artifact applied, or null for the unsteered baseline."""
    adapter: str | None
    """The LoRA adapter the text was generated through, or null for the bare checkpoint."""
    strength: float | None
    """The strength as given: in the residual stream's units, or a multiple of each layer's norm (``strength_unit``)."""
    strength_unit: Unit | None
    absolute_strength: dict[str, float] | None
    """Per steered layer, the scale the direction was added at, in the residual stream's units."""
    relative_strength: dict[str, float] | None
    """Per steered layer, the strength over that layer's activation norm: how large the push is
    against the residual stream it is added to."""
    mode: Mode = "add"
    """``add`` (steering), ``ablate`` or ``clamp``."""
    edits: dict[str, SiteEdit] | None = None
    """With ``ablate`` or ``clamp``: per site (``embedding`` or a block's index) the weight, the target and the
    artifact layer whose direction was used; null when steering or unsteered."""


class SiteEdit(BaseModel):
    """What an ablation or a clamp did at one site."""

    weight: float
    target: float
    direction_layer: int


def edits_shown(plan: Plan, directions: dict[int, list[float]]) -> dict[str, SiteEdit]:
    """A projecting plan as a result document shows it."""
    layer_of = {tuple(vector): layer for layer, vector in directions.items()}
    return {
        "embedding" if site == EMBEDDING else str(site): SiteEdit(
            weight=edit.weight, target=edit.target, direction_layer=layer_of[edit.direction]
        )
        for site, edit in sorted(plan.items())
    }


class Scales(BaseModel):
    """One strength resolved against an artifact: the scale at each layer, absolute and relative."""

    absolute: dict[int, float]
    relative: dict[int, float]
    """Only layers that record an activation norm."""

    def labelled(self, which: dict[int, float]) -> dict[str, float]:
        return {str(layer): value for layer, value in which.items()}


def scales_for(artifact: SteeringArtifact, strength: Strength, ctx: JobContext | None = None) -> Scales:
    """The strength at each layer of the artifact; refuses a relative strength where a norm is missing,
    and warns through ``ctx`` when the push is past ``EXCESSIVE`` times a layer's norm."""
    units = artifact.unit_scales()
    norms = {v.layer: v.activation_norm for v in artifact.vectors}
    absolute = strength.per_layer(units, artifact.unit)
    scales = Scales(
        absolute=absolute, relative={layer: absolute[layer] / norm for layer, norm in norms.items() if norm}
    )
    warning = excess_warning(strength, scales.relative, norms)
    if ctx is not None and warning:
        ctx.warn(warning)
    return scales


F = TypeVar("F", bound=InterventionFields)


def as_calibrated(request: F, artifact: SteeringArtifact | None, ctx: JobContext) -> F:
    """The request with an ablation-calibrated artifact's mode and weight profile where the request gives none
    of its own (``mode`` and the profile's fields not given); said in a log line. Otherwise as it is."""
    record = artifact.calibration.ablation if artifact is not None and artifact.calibration else None
    if record is None or "mode" in request.model_fields_set:
        return request
    calibrated = {"mode": "ablate", "direction_layer": record.direction_layer, **record.profile.model_dump()}
    update = {name: value for name, value in calibrated.items() if name not in request.model_fields_set}
    ctx.log(
        f"ablating as the artifact was calibrated: {record.trait_rate:.0%} of its held-out trait prompts refused "
        f"(from {record.trait_rate_before:.0%}) at first-token KL {record.kl_first:.3g}"
    )
    return request.model_copy(update=update)


def row_plan(
    artifact: SteeringArtifact,
    request: InterventionFields,
    strength: Strength,
    block_count: int,
    ctx: JobContext | None = None,
) -> Plan:
    """One row's edits: the artifact's directions added at ``strength`` (steering), or ablated with ``strength`` as
    the weight, or clamped with ``strength`` as the target (a multiple of each layer's unit with ``x``), at the
    sites of the request's mode, narrowed by its ``layers`` and weighted by its profile."""
    directions = artifact.by_layer()
    if request.direction_layer is not None and request.direction_layer not in directions:
        raise Refusal(
            f"{flag('direction_layer')} {request.direction_layer} names a layer the artifact has no direction for "
            f"(it has layers {', '.join(map(str, sorted(directions)))})"
        )
    narrowed = LayerSpec.parse(request.layers).resolve(block_count) if request.layers is not None else None
    where = sites(request.mode, narrowed, list(directions), block_count)
    if request.mode == "add":
        scales = scales_for(artifact, strength, ctx)
        return added(directions, {layer: scales.absolute[layer] for layer in where})
    if request.mode == "ablate":
        return projecting(directions, where, request.profile, request.direction_layer, weight=strength.value)
    targets = strength.per_layer(artifact.unit_scales(), artifact.unit)
    return projecting(directions, where, request.profile, request.direction_layer, targets=targets)


def given_strength(
    request: GenerateRequest | BakeRequest, ctx: JobContext, artifact: SteeringArtifact | None = None
) -> Strength:
    """The request's strength; when none was given, the artifact's calibrated positive strength where it has
    one (said in a log line), else ``DEFAULT_STRENGTH``. A strength given without a vector steers nothing, and
    says so."""
    if request.strength is not None and not request.vector:
        ctx.warn(
            f"{flag('strength')} {request.strength} has no effect without {flag('vector')}: this run is the unsteered baseline"
        )
    if request.strength is not None:
        return request.strength
    calibrated = calibrated_strength(artifact, 1)
    strength = default_strength(request.mode, artifact)
    if strength == calibrated and artifact is not None and artifact.calibration is not None:
        side = artifact.calibration.positive
        assert side is not None
        ctx.log(
            f"steering at the artifact's calibrated strength {calibrated}: mean KL {side.kl:.3g} from the "
            f"unsteered model on {artifact.calibration.neutral_prompts} neutral prompts, within its budget of "
            f"{artifact.calibration.kl_budget:g}"
        )
    return strength


def default_strength(mode: Mode, artifact: SteeringArtifact | None) -> Strength:
    """The strength a run of ``mode`` with ``artifact`` takes when it is given none (:func:`left_out_strength`)."""
    calibrated = calibrated_strength(artifact, 1)
    return left_out_strength(
        mode, artifact.strength_unit if artifact else None, calibrated.value if calibrated else None
    )


def left_out_strength(mode: Mode, strength_unit: str | None, calibrated: float | None) -> Strength:
    """The strength a run of ``mode`` takes when it is given none (the one rule every front end shows): an
    ablation's whole component (1); steering with an imported vector, the vector as it was (1x); with a
    calibrated artifact (``calibrated``: its positive strength, in its relative unit), that; else
    ``DEFAULT_STRENGTH``."""
    if mode == "ablate":
        return Strength(value=1.0, unit="absolute")
    if mode == "add" and strength_unit == "vector":
        return Strength(value=1.0, unit="relative")
    if mode == "add" and calibrated is not None:
        return Strength(value=calibrated, unit="relative")
    return Strength.model_validate(DEFAULT_STRENGTH)


def calibrated_strength(artifact: SteeringArtifact | None, sign: int) -> Strength | None:
    """The calibrated strength of one sign (a multiple of each layer's activation norm), or None."""
    if artifact is None or artifact.calibration is None:
        return None
    side = artifact.calibration.positive if sign > 0 else artifact.calibration.negative
    return None if side is None else Strength(value=round(side.strength, 4), unit="relative")


def generate_job(request: GenerateRequest, ctx: JobContext) -> GenerateResult:
    checkpoint = model_store(ctx).open(request, ctx)
    artifact = open_artifact(ctx, request.vector, checkpoint) if request.vector else None
    request = as_calibrated(request, artifact, ctx)
    strength = given_strength(request, ctx, artifact)
    blocks = checkpoint.config.num_hidden_layers
    plan = row_plan(artifact, request, strength, blocks, ctx) if artifact else {}
    scales = scales_for(artifact, strength) if artifact and request.mode == "add" else None
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    codec = checkpoint.codec
    prompt_ids = encode_within(codec, request.prompt, checkpoint.context, "the prompt")
    max_new_tokens = generation_budget(
        len(prompt_ids), request.max_new_tokens, request.default_max_new_tokens, checkpoint.context, ctx.log
    )
    from ster.engine.steering.runs import steered_decode  # torch, once every input has been checked

    decoder = model_store(ctx).decoder(checkpoint, ctx)
    stream = codec.stream()

    def on_token(index: int, token: int) -> None:
        delta = stream.step(codec.tokenizer, token)
        if delta:
            ctx.token(delta, index)

    what = _what(request.mode, strength, plan) if artifact else "unsteered"
    through = f" through adapter {request.adapter}" if adapter else ""
    ctx.progress(
        "generate", f"generating up to {max_new_tokens} tokens from a {len(prompt_ids)}-token prompt, {what}{through}"
    )
    with adapted(ctx, decoder, adapter, checkpoint):
        started = time.perf_counter()
        generation = steered_decode(
            decoder,
            prompt_ids,
            plan,
            max_new_tokens=max_new_tokens,
            sampling=Sampling(request.temperature, request.top_p, request.seed),
            eos_ids=codec.eos_ids,
            on_token=on_token,
            check_cancelled=ctx.check_cancelled,
        )
    elapsed = time.perf_counter() - started
    count = len(generation.ids)
    ctx.log(f"generated {count} tokens in {elapsed:.2f} s ({count / elapsed:.1f} tokens/s, prefill included)")
    return GenerateResult(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        prompt=request.prompt,
        text=codec.decode(generation.ids),
        tokens=count,
        prompt_tokens=len(prompt_ids),
        stop_reason=generation.stop_reason,
        chat_template=codec.decision,
        precision=request.precision,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        max_new_tokens=max_new_tokens,
        vector=str(request.vector) if artifact else None,
        adapter=str(request.adapter) if adapter else None,
        strength=strength.value if artifact else None,
        strength_unit=strength.unit if artifact else None,
        absolute_strength=scales.labelled(scales.absolute) if scales else None,
        relative_strength=scales.labelled(scales.relative) if scales else None,
        mode=request.mode,
        edits=edits_shown(plan, artifact.by_layer()) if artifact and request.mode != "add" else None,
    )


def _what(mode: Mode, strength: Strength, plan: Plan) -> str:
    """How the progress line says what the run does to the stream."""
    if mode == "add":
        return f"steered at strength {strength}"
    where = f"{len(plan)} site{'' if len(plan) == 1 else 's'}"
    if mode == "ablate":
        return f"the direction ablated at {where} (weight {strength.value:g})"
    return f"the direction clamped to {strength} at {where}"
