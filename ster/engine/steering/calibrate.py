"""The ``calibrate`` job: which layers, which method, and how hard per sign, measured on held-out pairs
against what it costs on a neutral prompt set.

**The search** is a staged grid, not a sampler: what a candidate's strength does is measured as a ladder
(``LADDER``, each magnitude both ways, every rung one row of the same forward), and KL grows smoothly with
the strength's magnitude, so the strength that spends the KL budget, and the behaviour there, are read off
the ladder by interpolation instead of being sampled trial by trial. What remains to
search is discrete and small: one candidate per layer (with caa), then pca and logistic at the three best
layers, then contiguous ranges of two to five layers around the best. Every candidate is measured on the
same screening sets (``SCREEN_PROMPTS`` neutral prompts and ``SCREEN_PAIRS`` held-out pairs, picked by
``--seed``), and the chosen one again on the whole neutral set and every held-out pair, its strengths
stepped back where the whole set spends more than the budget. The plan depends
only on the trials before it, so a study resumed after Ctrl-C ends exactly where an uninterrupted run ends.

**The score** of a candidate is the behaviour it moves toward each sign at that sign's strength, summed over
the two signs (a sign that moves behaviour the wrong way adds nothing and gets no strength). The chosen
candidate is the best-scoring one that moves behaviour both ways, where any does.

**The study** (``<output>.study.json``) holds the finished trials, written atomically after each one; it is
removed once the artifact is written, whose ``calibration`` record keeps every trial.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ster.engine.model.adapters.apply import adapted, check_adapter
from ster.engine.model.context import encode_each, encode_pairs
from ster.engine.model.loading import model_store
from ster.engine.protocol.errors import Cancelled, Refusal
from ster.engine.protocol.files import (
    ARTIFACT,
    check_output_file,
)
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.kinds import CALIBRATION_STUDY
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import bundled_name, example_path
from ster.engine.steering.artifact import ArtifactSummary, SteeringArtifact, save_artifact, summarize
from ster.engine.steering.calibration_record import Calibration, Point, Side, Trial
from ster.engine.steering.intervention import added
from ster.engine.steering.judge import question_for
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.requests import CalibrateRequest
from ster.engine.steering.study import (
    NEUTRAL,
    StudyFile,
    load_neutral,
    open_study,
    save_study,
    split,
    stopped,
    study_path,
)

if TYPE_CHECKING:
    from ster.engine.steering.directions import Method

LADDER = (0.1, 0.3, 0.9)
"""Magnitudes, in multiples of each layer's activation spread, every candidate is measured at (each both ways):
seven rows of one forward with strength 0. KL grows smoothly with the strength (as its square near 0), so
the budget's strength is interpolated between rungs a factor of 3 apart. In spread units a push costs about
the same KL on SmolLM2-135M and on Gemma 3 270M (0.5x: about 0.35 nats a token on both)."""
SCREEN_PROMPTS = 8
SCREEN_PAIRS = 6
SCREEN_ANSWER_TOKENS = 16
"""Tokens of each answer a screening pair is scored on: where the two answers part most (every answer counts in
full when the chosen candidate is measured again), and where most of the cost lies on a large vocabulary."""
CONTINUATION_TOKENS = 16
"""Tokens of the unsteered model's greedy continuation over which the mean KL is taken."""
BUDGET_TRIES = 3
"""Times the chosen strengths are stepped back when the whole neutral set spends more than the budget."""
GENERATION_PROMPTS = 6
"""Held-out questions answered at 0 and at each chosen strength (fluency, the judge, an example)."""
FLUENCY_TOKENS = 48
JUDGE_CHECK_PAIRS = 24
"""Held-out pairs whose own answers the judge is checked on."""
OTHER_METHODS: tuple[Method, ...] = ("pca", "logistic")
TOP_LAYERS = 3
RANGES = ((0, 1), (-1, 0), (-1, 1), (-2, 2))
"""Layer ranges tried around the best layer, as offsets of their first and last layer."""


class FrontPoint(BaseModel):
    layers: list[int]
    method: str
    strength: float
    kl: float
    behaviour_shift: float


class CalibrateResult(ArtifactSummary):
    front: list[FrontPoint]
    """Every measured point no other point beats on both behaviour moved (its sign's way) and KL, per sign."""


class Study(StudyFile):
    trials: list[Trial]


def plan_next(layers: list[int], trials: list[Trial], total: int) -> tuple[list[int], Method] | None:
    """The next candidate after ``trials``, or None when the plan is done."""
    done = {(tuple(t.layers), t.method) for t in trials}
    if len(trials) >= total:
        return None
    reserve = min(10, total // 2)
    first = _spread(layers, max(1, min(len(layers), total - reserve)))
    for layer in first:
        if ((layer,), "caa") not in done:
            return [layer], "caa"
    singles = sorted((t for t in trials if len(t.layers) == 1), key=lambda t: -t.score)
    best_layers: list[int] = []
    for trial in singles:
        if trial.layers[0] not in best_layers:
            best_layers.append(trial.layers[0])
    for layer in best_layers[:TOP_LAYERS]:
        for method in OTHER_METHODS:
            if ((layer,), method) not in done:
                return [layer], method
    best = max(trials, key=lambda t: t.score)
    if len(best.layers) != 1:
        return None
    centre, allowed = best.layers[0], set(layers)
    for low, high in RANGES:
        span = list(range(centre + low, centre + high + 1))
        if set(span) <= allowed and (tuple(span), best.method) not in done:
            return span, best.method
    return None


def _spread(layers: list[int], count: int) -> list[int]:
    if count >= len(layers):
        return list(layers)
    if count == 1:
        return [layers[len(layers) // 2]]
    return sorted({layers[round(i * (len(layers) - 1) / (count - 1))] for i in range(count)})


def at_budget(points: list[Point], sign: int, budget: float) -> float | None:
    """The magnitude of one sign where the mean KL reaches ``budget``, read off the ladder: walking out from 0,
    interpolated (log KL against log strength) between the last rung within the budget and the first past it;
    below the first rung KL grows as the square of the strength; the last rung when every rung is within it."""
    rungs = sorted((p for p in points if p.strength * sign > 0), key=lambda p: abs(p.strength))
    if not rungs:
        return None
    low = None
    for rung in rungs:
        if rung.kl > budget:
            if low is None:
                return abs(rung.strength) * math.sqrt(budget / rung.kl)
            if low.kl <= 0:
                return abs(low.strength)
            slope = (math.log(abs(rung.strength)) - math.log(abs(low.strength))) / (
                math.log(rung.kl) - math.log(low.kl)
            )
            return math.exp(math.log(abs(low.strength)) + (math.log(budget) - math.log(low.kl)) * slope)
        low = rung
    return abs(rungs[-1].strength)


def behaviour_at(points: list[Point], strength: float) -> float:
    """Behaviour at a signed strength, linear between the ladder's rungs on its side (0 included)."""
    sign = 1 if strength > 0 else -1
    rungs = sorted((p for p in points if p.strength * sign >= 0), key=lambda p: abs(p.strength))
    for low, high in itertools.pairwise(rungs):
        if abs(high.strength) >= abs(strength):
            share = (abs(strength) - abs(low.strength)) / (abs(high.strength) - abs(low.strength))
            return low.behaviour + share * (high.behaviour - low.behaviour)
    return rungs[-1].behaviour


def score(points: list[Point], budget: float) -> tuple[float | None, float | None, float]:
    """(positive strength, negative strength, score) of a measured ladder: each sign's strength at the budget
    and the behaviour it moves that sign's way, read off the ladder; a sign that moves it the wrong way is None."""
    base = next(p for p in points if p.strength == 0).behaviour
    up, down = at_budget(points, 1, budget), at_budget(points, -1, budget)
    moved_up = behaviour_at(points, up) - base if up else 0.0
    moved_down = base - behaviour_at(points, -down) if down else 0.0
    return (
        up if up and moved_up > 0 else None,
        -down if down and moved_down > 0 else None,
        max(moved_up, 0.0) + max(moved_down, 0.0),
    )


def _rank(trial: Trial, trials: list[Trial]) -> tuple[bool, float, int]:
    """A candidate that moves behaviour both ways within the budget, then its score, then the earlier."""
    return trial.positive is not None and trial.negative is not None, trial.score, -trials.index(trial)


def pareto(trials: list[Trial]) -> list[FrontPoint]:
    """Per sign, the measured points that no other point beats on both behaviour moved and KL, by KL."""
    front: list[FrontPoint] = []
    for sign in (1, -1):
        points: list[FrontPoint] = []
        for trial in trials:
            base = next(p for p in trial.points if p.strength == 0)
            points += [
                FrontPoint(
                    layers=trial.layers,
                    method=trial.method,
                    strength=p.strength,
                    kl=p.kl,
                    behaviour_shift=(p.behaviour - base.behaviour) * sign,
                )
                for p in trial.points
                if p.strength * sign > 0
            ]
        points.sort(key=lambda point: (point.kl, -point.behaviour_shift))
        best = float("-inf")
        for point in points:
            if point.behaviour_shift > best:
                front.append(point)
                best = point.behaviour_shift
    return front


def answered_pairs(
    codec: Any, pairs: list[Any], context: int
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[list[int], str, str]]]:
    """Each held-out pair as two answers to the question they share: the text both sides begin with (cut back
    to a space or a line break) is the prompt, a user turn where the model has a chat template, and the rest
    of each side is its answer, the assistant's turn. A pair whose sides share no such text is read as
    fitting reads it (each side a whole user turn), and then scored from each side's second token. Also, per
    pair with a shared prompt, the prompt's ids and the two answers' texts (the questions generation answers)."""
    out, questions = [], []
    for index, pair in enumerate(pairs):
        pos, neg = pair.positive, pair.negative
        common = 0
        while common < min(len(pos), len(neg)) and pos[common] == neg[common]:
            common += 1
        cut = max(pos.rfind(" ", 0, common + 1), pos.rfind("\n", 0, common + 1))
        prompt = pos[:cut].rstrip() if cut > 0 else ""
        if not prompt or not pos[cut:].strip() or not neg[cut:].strip():
            out.append(encode_pairs(codec, [(pos, neg)], context)[0])
            continue
        turns = [{"role": "user", "content": prompt}]
        head, positive = codec.encode_answer(turns, prompt, pos[cut:].strip())
        _, negative = codec.encode_answer(turns, prompt, neg[cut:].strip())
        for side, ids in (("positive", positive), ("negative", negative)):
            if len(head) + len(ids) > context:
                raise Refusal(
                    f"held-out pair {index}'s {side} side is {len(head) + len(ids)} tokens with its "
                    f"prompt, more than the model's context of {context} tokens"
                )
        out.append((head + positive, head + negative))
        questions.append((head, pos[cut:].strip(), neg[cut:].strip()))
    return out, questions


def _opening(pair: tuple[list[int], list[int]]) -> tuple[list[int], list[int]]:
    """A pair cut to the first ``SCREEN_ANSWER_TOKENS`` tokens of each answer after their shared prompt."""
    from ster.engine.steering.activations import (
        shared_prefix,  # torch: called once the job has imported it
    )

    positive, negative = pair
    shared = shared_prefix(positive, negative)
    return positive[: shared + SCREEN_ANSWER_TOKENS], negative[: shared + SCREEN_ANSWER_TOKENS]


def _identity(request: CalibrateRequest, fingerprint: str | None, digest: str) -> dict[str, Any]:
    fields = request.model_dump(mode="json", exclude={"resume", "output", "trials"})
    return {
        **fields,
        "fingerprint": fingerprint,
        "neutral_sha256": digest,
        "ladder": list(LADDER),
        "screen": [SCREEN_PROMPTS, SCREEN_PAIRS, SCREEN_ANSWER_TOKENS, CONTINUATION_TOKENS],
    }


def calibrate_job(request: CalibrateRequest, ctx: JobContext) -> BaseModel:
    if request.mode == "ablate":
        from ster.engine.steering.ablation_search import calibrate_ablation

        return calibrate_ablation(request, ctx)
    return calibrate_steering(request, ctx)


def calibrate_steering(request: CalibrateRequest, ctx: JobContext) -> CalibrateResult:
    pair_set, fit, held = split(request)
    prompts, digest = load_neutral(request.neutral)
    check_output_file(request.output, ARTIFACT, ctx.log)
    study = study_path(request.output)
    check_output_file(study, CALIBRATION_STUDY, what="calibration study")
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    identity = _identity(request, checkpoint.fingerprint, digest)
    resumed = open_study(study, request.resume, identity, Study)
    trials = resumed.trials if resumed is not None else []
    codec = checkpoint.codec
    fit_ids = encode_pairs(codec, [(p.positive, p.negative) for p in fit], checkpoint.context)
    held_ids, questions = answered_pairs(codec, held, checkpoint.context)
    judge_checkpoint, question = _judge(ctx, request, checkpoint, pair_set.trait_name)
    neutral_ids = encode_each(codec, prompts, checkpoint.context, "neutral prompt")
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.model.sampling import Sampling
    from ster.engine.steering import (  # torch, once every input has been checked
        calibration,
        fitting,
    )
    from ster.engine.steering.measures import greedy_continuations
    from ster.engine.steering.runs import steered_rows_decode

    spread = fitting.Spread(layers, checkpoint.config.hidden_size)
    positives, negatives = fitting.read_pairs(ctx, checkpoint, fit_ids, layers, request.batch_size, adapter, spread)
    directions = calibration.Directions(layers, positives, negatives, spread.values())
    model = model_store(ctx).decoder(checkpoint, ctx)
    rng = random.Random(request.seed)
    screen_prompts = sorted(rng.sample(range(len(prompts)), min(SCREEN_PROMPTS, len(prompts))))
    screen_pairs = sorted(rng.sample(range(len(held)), min(SCREEN_PAIRS, len(held))))
    with adapted(ctx, model, adapter, checkpoint):
        ctx.progress(
            "calibrate", f"continuing {len(prompts)} neutral prompts unsteered, {CONTINUATION_TOKENS} tokens each"
        )
        continuations = greedy_continuations(
            model, neutral_ids, CONTINUATION_TOKENS, codec.eos_ids, check_cancelled=ctx.check_cancelled
        )
        everything = calibration.Probes(list(zip(neutral_ids, continuations)), held_ids)
        screen = calibration.Probes(
            [everything.neutral[i] for i in screen_prompts], [_opening(held_ids[i]) for i in screen_pairs]
        )
        ladder = [0.0, *[m for m in LADDER], *[-m for m in LADDER]]
        if trials:
            ctx.log(f"resuming the study at {study} after {len(trials)} trials")
        try:
            while (candidate := plan_next(layers, trials, request.trials)) is not None:
                span, method = candidate
                ctx.progress(
                    "calibrate",
                    f"trial {len(trials) + 1}: {method} at {_layers(span)}, {len(ladder) - 1} strengths in one batch",
                    len(trials) + 1,
                    request.trials,
                )
                vectors = [directions.of(layer, method) for layer in span]
                points = calibration.measure(model, vectors, ladder, screen, ctx.check_cancelled)
                positive, negative, value = score(points, request.kl_budget)
                trials.append(
                    Trial(layers=span, method=method, points=points, positive=positive, negative=negative, score=value)
                )
                save_study(study, Study(identity=identity, trials=trials))
                ctx.log(
                    f"trial {len(trials)}: {method} at {_layers(span)}: score {value:.3g}, strength "
                    f"{_shown(positive)} / {_shown(negative)} at KL budget {request.kl_budget:g}"
                )
        except Cancelled:
            stopped(trials, study)
        best = max(trials, key=lambda t: _rank(t, trials))
        vectors = [directions.of(layer, best.method) for layer in best.layers]
        chosen = [0.0, *([best.positive] if best.positive else []), *([best.negative] if best.negative else [])]
        ctx.progress(
            "calibrate",
            f"measuring {best.method} at {_layers(best.layers)} on all {len(prompts)} neutral "
            f"prompts and {len(held)} held-out pairs",
        )
        try:
            final = calibration.measure(model, vectors, chosen, everything, ctx.check_cancelled)
            for _ in range(
                BUDGET_TRIES
            ):  # screened on a subset: where the whole set spends more, step back to the budget
                over = [p for p in final[1:] if p.kl > request.kl_budget]
                if not over:
                    break
                chosen = [
                    0.0,
                    *[
                        p.strength * (math.sqrt(request.kl_budget / p.kl) * 0.97 if p in over else 1.0)
                        for p in final[1:]
                    ],
                ]
                final = calibration.measure(model, vectors, chosen, everything, ctx.check_cancelled)
            chosen = [p.strength for p in final]
            asked = [
                questions[i] for i in sorted(rng.sample(range(len(questions)), min(GENERATION_PROMPTS, len(questions))))
            ]
            heads = [head for head, _, _ in asked]
            by_strength: dict[float, list[list[int]]] = {s: [] for s in chosen}
            chosen_directions = {v.layer: v.vector for v in vectors}
            plans = [added(chosen_directions, {v.layer: s * calibration.unit_of(v) for v in vectors}) for s in chosen]
            for ids in heads:
                ctx.check_cancelled()
                generations = steered_rows_decode(
                    model,
                    ids,
                    plans,
                    max_new_tokens=FLUENCY_TOKENS,
                    sampling=Sampling(0.0, None, 0),
                    eos_ids=codec.eos_ids,
                    on_token=lambda *a: None,
                    check_cancelled=ctx.check_cancelled,
                )
                for s, generation in zip(chosen, generations):
                    by_strength[s].append(generation.ids)
            ratios = calibration.fluency(model, heads, by_strength) if heads else {}
            texts = {s: [codec.decode(ids) for ids in generated] for s, generated in by_strength.items()}
        except Cancelled:
            stopped(trials, study)
    judged: dict[float, float | None] = {s: None for s in chosen}
    agreement = None
    if judge_checkpoint is not None and question is not None and asked:
        from ster.engine.steering.judge import judge_texts

        judge_model = model_store(ctx).decoder(judge_checkpoint, ctx)
        ctx.progress(
            "judge",
            f"asking {judge_checkpoint.source.model} whether each answer is {pair_set.trait_name or 'the trait'}",
        )
        try:
            for s, answers in texts.items():
                ctx.check_cancelled()
                scores = judge_texts(judge_model, judge_checkpoint.codec, answers, pair_set.trait_name, question)
                judged[s] = sum(scores) / len(scores)
            known = questions[:JUDGE_CHECK_PAIRS]
            judged_positive = judge_texts(
                judge_model, judge_checkpoint.codec, [p for _, p, _ in known], pair_set.trait_name, question
            )
            judged_negative = judge_texts(
                judge_model, judge_checkpoint.codec, [n for _, _, n in known], pair_set.trait_name, question
            )
            agreement = sum(a > b for a, b in zip(judged_positive, judged_negative)) / len(known)
        except Cancelled:
            stopped(trials, study)
    base = final[0]

    def side(point: Point | None) -> Side | None:
        if point is None:
            return None
        return Side(
            strength=point.strength,
            kl=point.kl,
            kl_first=point.kl_first,
            behaviour=point.behaviour,
            behaviour_shift=point.behaviour - base.behaviour,
            preferred=point.preferred,
            probability=point.probability,
            fluency=ratios.get(point.strength),
            judge=judged.get(point.strength),
            example=_first(texts.get(point.strength)),
        )

    positive_point = next((p for p in final if p.strength > 0), None)
    negative_point = next((p for p in final if p.strength < 0), None)
    record = Calibration(
        kl_budget=request.kl_budget,
        unit="spread" if all(v.activation_spread for v in vectors) else "norm",
        neutral=bundled_name(request.neutral or example_path(NEUTRAL)),
        neutral_sha256=digest,
        neutral_prompts=len(prompts),
        continuation_tokens=CONTINUATION_TOKENS,
        holdout_pairs=len(held),
        fit_pairs=len(fit),
        seed=request.seed,
        baseline=base,
        positive=side(positive_point),
        negative=side(negative_point),
        trials=trials,
        baseline_judge=judged.get(0.0),
        baseline_example=_first(texts.get(0.0)),
        judge=judge_checkpoint.source.model if judge_checkpoint and question else None,
        judge_question=question if judge_checkpoint else None,
        judge_agreement=agreement,
        generation_prompts=len(asked),
    )
    _report(ctx, record, best)
    front = pareto(trials)
    _report_front(ctx, front)
    artifact = SteeringArtifact(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        model_fingerprint=checkpoint.fingerprint,
        trait_name=pair_set.trait_name,
        method=best.method,
        hidden_size=checkpoint.config.hidden_size,
        precision=checkpoint.request.precision,
        chat_template=codec.decision,
        adapter=str(adapter.path) if adapter else None,
        metadata={
            "selection": f"calibrated over {len(trials)} trials within a mean KL of {request.kl_budget:g} on "
            f"{len(prompts)} neutral prompts, behaviour measured on {len(held)} held-out pairs"
        },
        vectors=vectors,
        calibration=record,
        strength_unit="spread" if all(v.activation_spread for v in vectors) else None,
    )
    ctx.check_cancelled()
    save_artifact(request.output, artifact)
    study.unlink(missing_ok=True)
    return CalibrateResult(**summarize(artifact).model_dump(), front=front)


def _judge(ctx: JobContext, request: CalibrateRequest, checkpoint: Any, trait: str) -> tuple[Any, str | None]:
    """The judge's checkpoint (opened, not loaded) and its question, or (None, None) for no judge."""
    if request.judge == "none":
        return None, None
    if request.judge is None:
        if checkpoint.codec.decision != "applied":
            ctx.log(
                "no judge: this model has no chat template, so it is not asked about its own answers; give "
                f"{flag('judge')} MODEL to name an instruct model"
            )
            return None, None
        question = question_for(trait, request.judge_question)
        return checkpoint, question
    question = question_for(trait, request.judge_question)
    from ster.engine.model.requests import ModelRequest

    judged = model_store(ctx).open(
        ModelRequest(model=request.judge, precision=request.precision, device=request.device), ctx
    )
    if judged.codec.decision != "applied":
        ctx.warn(f"judge {request.judge} has no chat template, so its question is asked as raw text")
    return judged, question


def _first(values: list[str] | None) -> str | None:
    return values[0] if values else None


def _report(ctx: JobContext, record: Calibration, best: Trial) -> None:
    ctx.log(
        f"chosen: {best.method} at {_layers(best.layers)}; unsteered behaviour {record.baseline.behaviour:+.3f} "
        f"(positive side preferred on {record.baseline.preferred:.0%} of {record.holdout_pairs} held-out pairs)"
    )
    ctx.log("| sign | strength | KL (mean) | KL (first token) | behaviour | moved | preferred | fluency |")
    for name, side in (("+", record.positive), ("-", record.negative)):
        if side is None:
            ctx.log(f"| {name} | none moves behaviour its way within the budget | | | | | | |")
            continue
        fluency = "-" if side.fluency is None else f"{side.fluency:.2f}"
        ctx.log(
            f"| {name} | {side.strength:+.3g}x | {side.kl:.3f} | {side.kl_first:.3f} | {side.behaviour:+.3f} | "
            f"{side.behaviour_shift:+.3f} | {side.preferred:.0%} | {fluency} |"
        )


def _report_front(ctx: JobContext, front: list[FrontPoint]) -> None:
    ctx.log("Pareto front on the screening sets (behaviour moved its sign's way against mean KL):")
    ctx.log("| sign | candidate | strength | KL (mean) | behaviour moved |")
    for point in front:
        sign = "+" if point.strength > 0 else "-"
        ctx.log(
            f"| {sign} | {point.method} at {_layers(point.layers)} | {point.strength:+.3g}x | {point.kl:.3f} | "
            f"{point.behaviour_shift:+.3f} |"
        )


def _layers(span: list[int]) -> str:
    return f"layer {span[0]}" if len(span) == 1 else f"layers {span[0]}-{span[-1]}"


def _shown(value: float | None) -> str:
    return "none" if value is None else f"{value:+.3g}x"
