"""The ``sweep`` job: which strength? Steered text, effect and degeneracy at every strength.

For each strength (0, the unsteered baseline, always included) and each prompt, the
steered text is generated. Per strength:

* **effect**: each generated text is re-read by the *unsteered* model exactly as a
  pair side is read when a direction is fitted (encoded through the same chat-template
  decision, the last token's state after the artifact's layers) and projected onto the
  unit direction in f64, averaged over layers. A prompt's effect is its text's reading
  minus its own baseline text's; the row's effect is the mean over prompts, with its
  noise and whether it can be told apart from 0 (see ``effect``). Its unit is the
  residual stream's own at those layers; ``relative_effect`` divides it by the layers'
  mean activation norm, so it reads alike across layers and models. Positive reads as
  closer to the pair set's positive side (the trait). It says how far the text itself
  moved along the trait as the model reads it, not how hard the residual stream was pushed.
* **degeneracy**: distinct-2 (unique token bigrams over all bigrams, mean over prompts),
  the longest run of one repeated token, and the mean length.

A strength is *fluent* when its distinct-2 is at least ``DISTINCT_RATIO`` of the
baseline's, its longest run at most ``RUN_SLACK`` tokens longer than the baseline's,
and its mean length at least ``LENGTH_RATIO`` of the baseline's (collapsing to an
immediate end of text is over-steering too). The suggested strength for each sign is
the largest one reached walking out from 0 before the first strength that is not
fluent whose effect is distinguishable from 0 and on its own side; null when there is
none. When no strength moves the text distinguishably, a warning says so.

Beside them, the measures ``calibrate`` chooses by (:mod:`ster.engine.steering.measures`), teacher-forced:

* **cost**: the mean KL(unsteered ‖ steered) over the unsteered model's own 16-token continuation of each of
  up to ``neutral_count`` neutral prompts (``kl``), and at its first position (``kl_first``);
* **behaviour**, with ``--holdout``: the mean over held-out pairs of log p(positive side) − log p(negative
  side) after their shared question, and the share of pairs whose positive side is the likelier;
* **fluency**: the unsteered model's perplexity of the row's texts over its perplexity of the baseline's.

``within_budget`` suggests per sign the largest strength, walking out from 0, before the first whose ``kl``
is over ``kl_budget``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from ster.engine.model.adapters.apply import adapted, check_adapter
from ster.engine.model.codec import TextCodec
from ster.engine.model.context import encode_each, generation_budget
from ster.engine.model.loading import model_store
from ster.engine.model.sampling import Generation, Sampling, StopReason
from ster.engine.pairs.model import load_pairs
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error, load_document
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import bundled_name, example_path
from ster.engine.steering.artifact import SteeringArtifact, open_artifact
from ster.engine.steering.calibrate import CONTINUATION_TOKENS, answered_pairs
from ster.engine.steering.effect import Judged, judge, paired, stillness, suggest
from ster.engine.steering.extract import PromptSet
from ster.engine.steering.generate import Scales, as_calibrated, calibrated_strength, row_plan, scales_for
from ster.engine.steering.intervention import Plan
from ster.engine.steering.requests import SweepRequest, sweep_strengths
from ster.engine.steering.strength import DEFAULT_SWEEP, Strength, Unit, parse_strengths
from ster.engine.steering.study import NEUTRAL, load_neutral

CALIBRATED_STEPS = (0.5, 1.0, 2.0)
"""The multiples of a calibrated strength a sweep walks when no strengths are given: where it starts, the
strength itself, and past it."""

if TYPE_CHECKING:
    from tokenizers.decoders import DecodeStream

    from ster.engine.model.contract import Decoder

DISTINCT_RATIO = 0.75
RUN_SLACK = 2
LENGTH_RATIO = 0.5


class SweepOutput(BaseModel):
    prompt: str
    text: str
    tokens: int
    stop_reason: StopReason
    projection: float | None
    """The text's re-read projection onto the direction, mean over layers (null for an empty text)."""
    effect: float | None = None
    """``projection`` minus this prompt's baseline projection; exactly 0 when the text is the baseline's."""


class SweepRow(BaseModel):
    strength: float
    """In the sweep's ``strength_unit``: the residual stream's units, or multiples of each layer's norm."""
    absolute_strength: dict[str, float]
    """Per layer, the scale the direction was added at."""
    relative_strength: dict[str, float]
    """Per layer, that scale over the layer's activation norm."""
    projection: float | None
    """Mean projection of the re-read texts onto the direction (null when every text is empty)."""
    effect: float | None
    """Mean over prompts of each text's projection minus its prompt's baseline projection, in the residual
    stream's units at the artifact's layers; positive reads as closer to the trait (the pairs' positive side)."""
    relative_effect: float | None
    """``effect`` over the mean activation norm of the artifact's layers (null where a norm is not recorded)."""
    noise: float | None
    """Standard error of ``effect`` over prompts (null with fewer than two prompts to compare)."""
    threshold: float | None
    """The |effect| that counts as distinguishable from 0: Student's t (95%, two-sided) times ``noise``."""
    distinguishable: bool
    """Whether |effect| exceeds ``threshold``; only such strengths are suggested."""
    changed: int
    """Prompts whose text differs from their unsteered text."""
    distinct_2: float | None
    longest_run: int
    mean_tokens: float
    fluent: bool
    kl: float | None = None
    """Mean KL (nats a token) from the unsteered model over each neutral prompt's unsteered continuation."""
    kl_first: float | None = None
    """The same KL at the continuation's first position (heretic's measure)."""
    behaviour: float | None = None
    """Mean over the held-out pairs of log p(positive side) − log p(negative side); null without ``--holdout``."""
    behaviour_shift: float | None = None
    """``behaviour`` minus the baseline's: positive is toward the pairs' positive side."""
    preferred: float | None = None
    """Share of the held-out pairs whose positive side is the likelier; null without ``--holdout``."""
    fluency: float | None = None
    """The unsteered model's perplexity of this row's texts over its perplexity of the baseline's texts."""
    outputs: list[SweepOutput]


class Suggested(BaseModel):
    """Per sign, in the sweep's ``strength_unit``: the largest strength, walking out from 0 before the first that
    is not fluent, whose effect is distinguishable from 0 and on its own side (null when there is none)."""

    positive: float | None
    negative: float | None


class DegeneracyBound(BaseModel):
    distinct_2_ratio: float = DISTINCT_RATIO
    longest_run_slack: int = RUN_SLACK
    length_ratio: float = LENGTH_RATIO


class SweepResult(BaseModel):
    model: str
    model_revision: str | None
    vector: str
    adapter: str | None
    """The LoRA adapter the texts were generated and re-read through, or null for the bare checkpoint."""
    trait_name: str
    layers: list[int]
    strength_unit: Unit
    chat_template: str
    precision: str
    max_new_tokens: int
    temperature: float
    seed: int
    bound: DegeneracyBound
    neutral: str
    """The neutral set the KL is measured on (a bundled name or a path)."""
    neutral_prompts: int
    holdout_pairs: int | None
    """Held-out pairs the behaviour is measured on; null without ``--holdout``."""
    kl_budget: float
    rows: list[SweepRow]
    suggested: Suggested
    within_budget: Suggested
    """Per sign, the largest strength walking out from 0 before the first whose ``kl`` is over ``kl_budget``."""
    moved: bool
    """Whether any steered strength moved the text distinguishably from 0 (a warning says so when none did)."""


def distinct_2(ids: list[int]) -> float | None:
    bigrams = list(itertools.pairwise(ids))
    return len(set(bigrams)) / len(bigrams) if bigrams else None


def longest_run(ids: list[int]) -> int:
    best = run = 0
    for i, token in enumerate(ids):
        run = run + 1 if i and token == ids[i - 1] else 1
        best = max(best, run)
    return best


def _prompts(request: SweepRequest) -> list[str]:
    if request.prompt_texts is not None:
        try:
            return PromptSet(prompts=request.prompt_texts).prompts
        except ValidationError as exc:
            raise Refusal(f"the sweep's prompts are not usable: {first_error(exc)}") from None
    if request.prompts is None:
        raise Refusal(f"sweep needs prompts: give {flag('prompts')} FILE")
    return load_document(request.prompts, PromptSet, "prompts").prompts


def _swept(request: SweepRequest) -> list[Strength]:
    """The request's strengths, once the job has filled in the default."""
    assert request.strengths is not None, "sweep_job resolves the default strengths first"
    return request.strengths


ABLATION_SWEEP = "0.25,0.5,1"
"""What a sweep of ablation walks without ``--strengths``: a quarter, half and all of the component removed."""


def _default_strengths(request: SweepRequest, artifact: SteeringArtifact, ctx: JobContext) -> list[Strength]:
    """The given strengths; else half, once and twice each calibrated strength (said in a log line); else
    ``DEFAULT_SWEEP``."""
    if request.strengths is not None:
        return request.strengths
    if request.mode == "ablate":
        return sweep_strengths(parse_strengths(ABLATION_SWEEP))
    calibrated = [s for s in (calibrated_strength(artifact, 1), calibrated_strength(artifact, -1)) if s is not None]
    calibrated = calibrated if request.mode == "add" else []
    if not calibrated:
        return sweep_strengths(parse_strengths(DEFAULT_SWEEP))
    budget = artifact.calibration.kl_budget if artifact.calibration else request.kl_budget
    ctx.log(
        f"sweeping half, once and twice the artifact's calibrated strengths "
        f"({' and '.join(s.signed() for s in calibrated)}, calibrated to a KL budget of {budget:g})"
    )
    return sweep_strengths(
        [Strength(value=round(step * s.value, 4), unit="relative") for s in calibrated for step in CALIBRATED_STEPS]
    )


def _neutral_prompts(request: SweepRequest) -> list[str]:
    """At most ``neutral_count`` of the neutral set's prompts, spread evenly through it."""
    prompts, _ = load_neutral(request.neutral)
    count = min(request.neutral_count, len(prompts))
    return [prompts[(i * len(prompts)) // count] for i in range(count)]


def sweep_job(request: SweepRequest, ctx: JobContext) -> SweepResult:
    prompts = _prompts(request)
    neutral = _neutral_prompts(request)
    held = load_pairs(request.holdout).pairs if request.holdout is not None else None
    checkpoint = model_store(ctx).open(request, ctx)
    artifact = open_artifact(ctx, request.vector, checkpoint)
    request = as_calibrated(request, artifact, ctx)
    request = request.model_copy(update={"strengths": _default_strengths(request, artifact, ctx)})
    blocks = checkpoint.config.num_hidden_layers
    strongest = max(_swept(request), key=lambda s: abs(s.value))
    row_plan(artifact, request, strongest, blocks, ctx)  # refuses or warns before loading
    # 0 is the unedited model in every mode (a clamp to 0 is an ablation: ask for that with --mode ablate)
    plans = [row_plan(artifact, request, s, blocks) if s.value else {} for s in _swept(request)]
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    codec = checkpoint.codec
    encoded = encode_each(codec, prompts, checkpoint.context, "sweep prompt")
    neutral_ids = encode_each(codec, neutral, checkpoint.context, "neutral prompt")
    held_ids = answered_pairs(codec, held, checkpoint.context)[0] if held is not None else []
    request = request.model_copy(
        update={
            "max_new_tokens": generation_budget(
                max(map(len, encoded)),
                request.max_new_tokens,
                request.default_max_new_tokens,
                checkpoint.context,
                ctx.log,
            )
        }
    )
    model = model_store(ctx).decoder(checkpoint, ctx)
    directions = artifact.by_layer()
    with adapted(ctx, model, adapter, checkpoint):
        generated = _generate(ctx, model, codec, request, encoded, plans)
        rows = [
            _measure(
                model,
                codec,
                artifact,
                request,
                prompts,
                [by_strength[step] for by_strength in generated],
                directions,
                step,
            )
            for step in range(len(_swept(request)))
        ]
        rows = _costs(
            ctx, model, codec, plans, request, rows, generated, encoded, neutral_ids, held_ids if held else None
        )
    rows = _judge(rows, _mean_norm(artifact))
    verdicts = [
        Judged(
            strength=r.strength,
            label=_swept(request)[i].signed(),
            effect=r.effect,
            threshold=r.threshold,
            distinguishable=r.distinguishable,
            fluent=r.fluent,
        )
        for i, r in enumerate(rows)
    ]
    _summarise(ctx, rows, verdicts, artifact.trait_name, len(prompts))
    budget = Suggested(
        positive=within_budget(rows, 1, request.kl_budget), negative=within_budget(rows, -1, request.kl_budget)
    )
    ctx.log(
        f"within the KL budget of {request.kl_budget:g} (mean over {len(neutral)} neutral prompts): "
        f"{_reach(budget.positive, request)} toward the trait, {_reach(budget.negative, request)} away from it"
    )
    sentence = stillness(verdicts, len(prompts))
    if sentence:
        ctx.warn(sentence)
    return SweepResult(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        vector=str(request.vector),
        adapter=str(request.adapter) if adapter else None,
        trait_name=artifact.trait_name,
        layers=sorted(directions),
        strength_unit=_swept(request)[0].unit,
        chat_template=codec.decision,
        precision=request.precision,
        max_new_tokens=_budget(request),
        temperature=request.temperature,
        seed=request.seed,
        bound=DegeneracyBound(),
        neutral=bundled_name(request.neutral or example_path(NEUTRAL)),
        neutral_prompts=len(neutral),
        holdout_pairs=len(held) if held is not None else None,
        kl_budget=request.kl_budget,
        rows=rows,
        suggested=Suggested(positive=suggest(verdicts, 1), negative=suggest(verdicts, -1)),
        within_budget=budget,
        moved=sentence is None,
    )


def _budget(request: SweepRequest) -> int:
    """The token budget per text, which the job settles before it generates anything."""
    assert request.max_new_tokens is not None
    return request.max_new_tokens


def _generate(
    ctx: JobContext,
    model: Decoder,
    codec: TextCodec,
    request: SweepRequest,
    encoded: list[list[int]],
    plans: list[Plan],
) -> list[list[Generation]]:
    """Per prompt, the text at every strength, decoded as one batch (each row edited by its own plan)."""
    from ster.engine.steering.runs import (
        steered_rows_decode,  # torch, once every input has been checked
    )

    strengths = _swept(request)
    generated = []
    for index, ids in enumerate(encoded):
        ctx.progress(
            "sweep",
            f"prompt {index + 1}/{len(encoded)}: {len(strengths)} strengths in one batch",
            index + 1,
            len(encoded),
        )
        streams = [codec.stream() for _ in strengths]

        def on_token(row: int, i: int, token: int, index: int = index, streams: list[DecodeStream] = streams) -> None:
            delta = streams[row].step(codec.tokenizer, token)
            if delta:
                ctx.token(delta, i, stream=f"{strengths[row].signed()}/{index}")

        generated.append(
            steered_rows_decode(
                model,
                ids,
                plans,
                max_new_tokens=_budget(request),
                sampling=Sampling(request.temperature, request.top_p, request.seed),
                eos_ids=codec.eos_ids,
                on_token=on_token,
                check_cancelled=ctx.check_cancelled,
            )
        )
    return generated


def _measure(
    model: Decoder,
    codec: TextCodec,
    artifact: SteeringArtifact,
    request: SweepRequest,
    prompts: list[str],
    generations: list[Generation],
    directions: dict[int, list[float]],
    step: int,
) -> SweepRow:
    """One strength's row: the texts re-read unsteered, their projections and degeneracy."""
    strength = _swept(request)[step]
    scales = scales_for(artifact, strength) if request.mode == "add" else Scales(absolute={}, relative={})
    generated = [generation.ids for generation in generations]
    texts = [codec.decode(ids) for ids in generated]
    readings = _readings(model, codec, texts, directions)
    outputs = [
        SweepOutput(prompt=prompt, text=text, tokens=len(g.ids), stop_reason=g.stop_reason, projection=reading)
        for prompt, text, g, reading in zip(prompts, texts, generations, readings)
    ]
    projections = [r for r in readings if r is not None]
    distincts = [d for d in map(distinct_2, generated) if d is not None]
    return SweepRow(
        strength=strength.value,
        absolute_strength=scales.labelled(scales.absolute),
        relative_strength=scales.labelled(scales.relative),
        projection=sum(projections) / len(projections) if projections else None,
        effect=None,
        relative_effect=None,
        noise=None,
        threshold=None,
        distinguishable=False,
        changed=0,
        distinct_2=sum(distincts) / len(distincts) if distincts else None,
        longest_run=max(map(longest_run, generated)),
        mean_tokens=sum(map(len, generated)) / len(generated),
        fluent=True,
        outputs=outputs,
    )


def _costs(
    ctx: JobContext,
    model: Decoder,
    codec: TextCodec,
    plans: list[Plan],
    request: SweepRequest,
    rows: list[SweepRow],
    generated: list[list[Generation]],
    prompts: list[list[int]],
    neutral: list[list[int]],
    held: list[tuple[list[int], list[int]]] | None,
) -> list[SweepRow]:
    """Every row's KL on the neutral prompts, behaviour on the held-out pairs (with ``--holdout``) and fluency,
    all strengths as the rows of one forward per packed group of texts."""
    from ster.engine.steering.calibration import Probes, fluency, measure_plans
    from ster.engine.steering.measures import greedy_continuations

    what = f" and {len(held)} held-out pairs" if held else ""
    ctx.progress("measure", f"measuring every strength's KL on {len(neutral)} neutral prompts{what}")
    continuations = greedy_continuations(
        model, neutral, CONTINUATION_TOKENS, codec.eos_ids, check_cancelled=ctx.check_cancelled
    )
    values = [strength.value for strength in _swept(request)]
    order = sorted(range(len(values)), key=lambda i: values[i] != 0)  # the unsteered row first: KL is from it
    measured = measure_plans(
        model,
        [plans[i] for i in order],
        [values[i] for i in order],
        Probes(list(zip(neutral, continuations)), held or []),
        ctx.check_cancelled,
    )
    points = [measured[order.index(i)] for i in range(len(values))]
    texts = {row.strength: [by_strength[step].ids for by_strength in generated] for step, row in enumerate(rows)}
    ratios = fluency(model, prompts, texts)
    base = next(point for point in points if point.strength == 0)
    return [
        row.model_copy(
            update={
                "kl": point.kl,
                "kl_first": point.kl_first,
                "fluency": ratios[row.strength],
                **(
                    {
                        "behaviour": point.behaviour,
                        "behaviour_shift": point.behaviour - base.behaviour,
                        "preferred": point.preferred,
                    }
                    if held
                    else {}
                ),
            }
        )
        for row, point in zip(rows, points)
    ]


def within_budget(rows: list[SweepRow], sign: int, budget: float) -> float | None:
    """Walking out from 0 on one side, the largest strength before the first whose KL is over ``budget``."""
    chosen = None
    for row in sorted((r for r in rows if r.strength * sign > 0), key=lambda r: abs(r.strength)):
        if row.kl is None or row.kl > budget:
            break
        chosen = row.strength
    return chosen


def _reach(strength: float | None, request: SweepRequest) -> str:
    if strength is None:
        return "no strength"
    unit = "x" if _swept(request)[0].relative else ""
    return f"up to {strength:+g}{unit}"


def _summarise(ctx: JobContext, rows: list[SweepRow], verdicts: list[Judged], trait: str, prompts: int) -> None:
    """One log line saying what the effect is, then one line per strength, for a reader of the progress."""
    toward = f"toward {trait}" if trait else "toward the pairs' positive side"
    ctx.log(
        f"effect: each steered text's reading along the direction (re-read unsteered) minus its unsteered "
        f"text's, mean over {prompts} prompts, in the residual stream's units (positive: {toward}); "
        f"distinguishable when beyond Student's t (95%) times its standard error"
    )
    for row, verdict in zip(rows, verdicts):
        if row.strength == 0:
            continue
        effect = "no effect" if row.effect is None else f"effect {row.effect:+.3g}"
        relative = "" if row.relative_effect is None else f" ({row.relative_effect:+.3f} of the norm)"
        noise = "" if row.noise is None else f", noise {row.noise:.3g}"
        judged = "not distinguishable"
        if row.distinguishable:
            against = (row.effect or 0.0) * row.strength < 0
            judged = "distinguishable, against the push" if against else "distinguishable"
        cost = "" if row.kl is None else f"; KL {row.kl:.3g}"
        moved = "" if row.behaviour_shift is None else f", behaviour {row.behaviour_shift:+.3g}"
        ctx.log(
            f"{verdict.label}: {effect}{relative}{noise}, {judged}; {row.changed}/{prompts} texts changed; "
            f"{'fluent' if row.fluent else 'not fluent'}{cost}{moved}"
        )


def _readings(
    model: Decoder, codec: TextCodec, texts: list[str], directions: dict[int, list[float]]
) -> list[float | None]:
    """Each text's unsteered re-read projection, None for an empty text."""
    from ster.engine.steering.runs import text_projections

    kept = [i for i, text in enumerate(texts) if text.strip()]
    values = text_projections(model, [codec.encode_prompt(texts[i]) for i in kept], directions) if kept else []
    readings: list[float | None] = [None] * len(texts)
    for i, value in zip(kept, values):
        readings[i] = value
    return readings


def _mean_norm(artifact: SteeringArtifact) -> float | None:
    """The mean activation norm of the artifact's layers: the scale ``relative_effect`` is read against."""
    norms = [v.activation_norm for v in artifact.vectors if v.activation_norm]
    return sum(norms) / len(norms) if len(norms) == len(artifact.vectors) else None


def _judge(rows: list[SweepRow], norm: float | None) -> list[SweepRow]:
    """Fill in each row's per-prompt effects against the baseline's texts, their mean and noise, and whether
    the row stays within the degeneracy bound."""
    base = next(row for row in rows if row.strength == 0)
    judged = []
    for row in rows:
        unchanged = [o.text == b.text for o, b in zip(row.outputs, base.outputs)]
        effects = paired([o.projection for o in row.outputs], [b.projection for b in base.outputs], unchanged)
        verdict = judge(effects)
        fluent = (
            row.longest_run <= base.longest_run + RUN_SLACK
            and row.mean_tokens >= LENGTH_RATIO * base.mean_tokens
            and (base.distinct_2 is None or (row.distinct_2 or 0.0) >= DISTINCT_RATIO * base.distinct_2)
        )
        outputs = [o.model_copy(update={"effect": e}) for o, e in zip(row.outputs, effects)]
        relative = verdict.mean / norm if verdict.mean is not None and norm else None
        judged.append(
            row.model_copy(
                update={
                    "effect": verdict.mean,
                    "relative_effect": relative,
                    "noise": verdict.noise,
                    "threshold": verdict.threshold,
                    "distinguishable": verdict.distinguishable,
                    "changed": unchanged.count(False),
                    "fluent": fluent,
                    "outputs": outputs,
                }
            )
        )
    return judged
