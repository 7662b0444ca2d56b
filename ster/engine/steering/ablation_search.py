"""``calibrate --mode ablate``: which direction to ablate, and how strongly at each block, measured against the
trait it removes and what it costs.

**The two objectives** are the *trait rate* and the *cost*. The trait rate is the share of held-out trait
prompts (the held-out pairs' positive sides: the prompts the model refuses) whose greedy answer, the first
``ANSWER_TOKENS`` tokens, the refusal judge (:mod:`ster.engine.steering.refusal_judge`) reads as a refusal.
The cost is the KL from the unedited model of the next-token distribution at the first generated position,
averaged over the neutral prompts: the measure heretic scores an abliteration by.

**The search** samples what heretic samples: the layer whose direction is ablated (caa, fitted on the pairs,
less its component along the answered prompts' mean state, as heretic orthogonalises its direction),
and the weight profile of :class:`~ster.engine.steering.intervention.Profile` (its peak weight, where it
peaks, its minimum, how far it reaches), with Optuna's multi-objective TPE sampler, seeded per batch so that
a study resumed after Ctrl-C asks what an uninterrupted one asks. A batch of ``BATCH`` candidates is measured
at once: every candidate's answers to every screening prompt are rows of one batched greedy decode, each row
ablated by its own candidate (the chat template's shared start prefilled once a candidate, and an answer
leaving the batch as soon as the judge reads a refusal in it, which no later token can undo), and every
candidate's KL on the screening prompts is a row of one forward. The screening sets are ``SCREEN_PROMPTS``
trait prompts and up to ``SCREEN_NEUTRAL`` neutral prompts picked by ``--seed``: the KL, one forward, is
cheap to measure on many, and a budget judged on few prompts misleads (a candidate within it on 16 spends
more on 40). ``FINALISTS`` of the screening (the best within the KL budget, and the best just over it) are
measured again on every held-out trait prompt and every neutral prompt; a finalist that spends more than the
KL budget there has its weights stepped back (``STEP_BACKS``), and the chosen one is the finalist with the
lowest trait rate within the budget (then the lowest KL). Its weights are then tried at smaller scales
(``TRIMS``), and the cheapest scale that refuses no more is kept.

The artifact holds the chosen layer's direction and a ``calibration`` record with the ablation's profile, so
``generate`` (and everything else) ablates as calibrated unless told otherwise.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ster.engine.model.adapters.apply import adapted, check_adapter
from ster.engine.model.context import encode_each, encode_pairs
from ster.engine.model.loading import model_store
from ster.engine.protocol.errors import Cancelled, Refusal
from ster.engine.protocol.files import ARTIFACT, check_output_file
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.kinds import CALIBRATION_STUDY
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import bundled_name, example_path
from ster.engine.steering.artifact import ArtifactSummary, SteeringArtifact, save_artifact, summarize
from ster.engine.steering.calibration_record import (
    Ablation,
    AblationPoint,
    AblationTrial,
    Calibration,
    Point,
    ablation_front,
)
from ster.engine.steering.intervention import Plan, Profile, projecting, sites
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.refusal_judge import load_markers, refuses
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
    from ster.engine.model.contract import Decoder
    from ster.engine.steering.artifact import LayerVector
    from ster.engine.steering.calibration import Directions

BATCH = 8
"""Candidates measured together, as rows of one decode and one forward."""
SCREEN_PROMPTS = 16
SCREEN_NEUTRAL = 40
"""Neutral prompts each candidate's KL is screened on (all of them, up to this many)."""
ANSWER_TOKENS = 24
"""Tokens of each answer the judge reads: a refusal says so at once."""
CONTINUATION_TOKENS = 16
EXAMPLES = 3
FINALISTS = 6
"""Candidates of the screening measured again on every held-out and neutral prompt, where the choice is made (a
candidate just within the budget on the screening prompts may spend more on all of them): half the best within
the budget, half the best that spend up to ``STEP_REACH`` times it, which stepping their weights back may bring
within it at fewer refusals than any candidate found within it."""
STEP_REACH = 2.0
STEP_BACKS = 3
"""Times a finalist that spends more than the budget on the whole neutral set has its weights scaled back (by
the square root of budget over KL, KL growing as the square of a small weight) and is measured again."""
STEP_MARGIN = 0.95
TRIMS = (0.9, 0.8, 0.7, 0.6)
"""Scales of the chosen ablation's weights measured, as rows of one batch, on every held-out and neutral prompt:
the search keeps the first candidate that refuses fewest, which may spend more of the budget than it needs, so
the lowest-KL rung that refuses no more is taken instead."""


class AblationResult(ArtifactSummary):
    front: list[AblationPoint]
    """The candidates no other beats on both the trait rate and the KL, by KL."""


class AblationStudy(StudyFile):
    trials: list[AblationTrial]


def ranges(blocks: int, layers: list[int]) -> dict[str, Any]:
    """What each parameter may be, in heretic's ranges: the direction of a layer from 40% to 90% of the depth, a
    peak weight of 0.8 to 1.5 in the later 40% of the blocks, a minimum of 0 to the peak, reaching 1 to 60% of
    the blocks. (heretic also interpolates between two layers' directions, or takes each layer's own, and gives
    the attention's and the MLP's writes a profile each; here one layer's direction and one profile.)"""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    last = blocks - 1
    candidates = [layer for layer in layers if 0.4 * last <= layer <= 0.9 * last] or layers
    return {
        "direction_layer": CategoricalDistribution(candidates),
        "peak_weight": FloatDistribution(0.8, 1.5),
        "peak_layer": FloatDistribution(0.6 * last, float(last)),
        "min_share": FloatDistribution(0.0, 1.0),
        "falloff": FloatDistribution(1.0, max(1.0, 0.6 * last)),
    }


def profile_of(params: dict[str, Any]) -> Profile:
    return Profile(
        peak_weight=params["peak_weight"],
        peak_layer=params["peak_layer"],
        min_weight=params["min_share"] * params["peak_weight"],
        falloff=params["falloff"],
    )


def calibrate_ablation(request: CalibrateRequest, ctx: JobContext) -> AblationResult:
    pair_set, fit, held = split(request)
    prompts, digest = load_neutral(request.neutral)
    markers = load_markers(request.refusal_markers)
    check_output_file(request.output, ARTIFACT, ctx.log)
    study_file = study_path(request.output)
    check_output_file(study_file, CALIBRATION_STUDY, what="calibration study")
    checkpoint = model_store(ctx).open(request, ctx)
    blocks = checkpoint.config.num_hidden_layers
    layers = LayerSpec.parse(request.layers).resolve(blocks)
    identity = {
        **request.model_dump(mode="json", exclude={"resume", "output", "trials"}),
        "fingerprint": checkpoint.fingerprint,
        "neutral_sha256": digest,
        "markers": list(markers),
        "screen": [BATCH, SCREEN_PROMPTS, SCREEN_NEUTRAL, ANSWER_TOKENS],
        "direction": "caa orthogonal to the answered mean",
    }
    resumed = open_study(study_file, request.resume, identity, AblationStudy)
    trials = resumed.trials if resumed is not None else []
    codec = checkpoint.codec
    fit_ids = encode_pairs(codec, [(p.positive, p.negative) for p in fit], checkpoint.context)
    trait_ids = encode_each(codec, [p.positive for p in held], checkpoint.context, "held-out trait prompt")
    other_ids = encode_each(codec, [p.negative for p in held], checkpoint.context, "held-out answered prompt")
    neutral_ids = encode_each(codec, prompts, checkpoint.context, "neutral prompt")
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.steering import calibration, fitting  # torch, once every input has been checked
    from ster.engine.steering.measures import greedy_continuations

    spread = fitting.Spread(layers, checkpoint.config.hidden_size)
    positives, negatives = fitting.read_pairs(ctx, checkpoint, fit_ids, layers, request.batch_size, adapter, spread)
    directions = calibration.Directions(layers, positives, negatives, spread.values())
    model = model_store(ctx).decoder(checkpoint, ctx)
    rng = random.Random(request.seed)
    screen_trait = sorted(rng.sample(range(len(trait_ids)), min(SCREEN_PROMPTS, len(trait_ids))))
    screen_neutral = sorted(rng.sample(range(len(neutral_ids)), min(SCREEN_NEUTRAL, len(neutral_ids))))
    space = ranges(blocks, layers)

    def plan(params: dict[str, Any]) -> Plan:
        vector = projected(directions, int(params["direction_layer"])).vector
        where = sites("ablate", None, [int(params["direction_layer"])], blocks)
        return projecting({int(params["direction_layer"]): vector}, where, profile_of(params))

    def said(ids: list[int]) -> bool:
        return refuses(codec.decode(ids), markers)

    def judge(plans: list[Plan], prompts: list[list[int]], whole: bool = False) -> list[list[str]]:
        """Each plan's greedy answers to ``prompts``, decoded: every (prompt, plan) a row of one decode. An answer
        stops where the judge reads a refusal in it (later tokens cannot undo one), unless ``whole``."""
        rows = [(prompt, p) for p in plans for prompt in prompts]
        ids = greedy_continuations(
            model,
            [prompt for prompt, _ in rows],
            ANSWER_TOKENS,
            codec.eos_ids,
            batch_size=128,
            check_cancelled=ctx.check_cancelled,
            plans=[p for _, p in rows],
            settled=None if whole else said,
        )
        texts = [codec.decode(answer) for answer in ids]
        return [texts[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(plans))]

    with adapted(ctx, model, adapter, checkpoint):
        ctx.progress("calibrate", f"answering {len(trait_ids)} held-out trait prompts unedited")
        firsts = greedy_continuations(model, neutral_ids, 1, codec.eos_ids, check_cancelled=ctx.check_cancelled)
        neutral_items = list(zip(neutral_ids, firsts))
        screen_items = [neutral_items[i] for i in screen_neutral]
        screen_prompts = [trait_ids[i] for i in screen_trait]
        base_answers = judge([{}], trait_ids, whole=True)[0]
        base_rate = _rate(base_answers, markers)
        ctx.log(f"unedited, {base_rate:.0%} of the {len(trait_ids)} held-out trait prompts are refused")
        if base_rate == 0:
            first = " ".join(base_answers[0].split())[:60]
            raise Refusal(
                f"none of the {len(trait_ids)} held-out trait prompts is refused unedited (the first answer: "
                f'"{first}"), so there is no refusal for an ablation to remove; give {flag("refusal_markers")} with '
                "phrases that mark how this model refuses, or pairs whose positive prompts it refuses"
            )
        if trials:
            ctx.log(f"resuming the study at {study_file} after {len(trials)} trials")
        try:
            while len(trials) < request.trials:
                batch = min(BATCH, request.trials - len(trials))
                asked = _ask(space, trials, batch, request.seed)
                ctx.progress(
                    "calibrate",
                    f"trials {len(trials) + 1}-{len(trials) + batch}: {batch} ablations in one batch",
                    len(trials) + batch,
                    request.trials,
                )
                plans = [plan(params) for params in asked]
                answers = judge(plans, screen_prompts)
                costs = _first_kls(model, screen_items, plans, ctx)
                for params, texts, kl in zip(asked, answers, costs):
                    trials.append(AblationTrial(**params, trait_rate=_rate(texts, markers), kl_first=kl))
                save_study(study_file, AblationStudy(identity=identity, trials=trials))
                best = min(trials, key=lambda t: _rank(t, request.kl_budget))
                ctx.log(
                    f"after {len(trials)} trials the best within the budget refuses {best.trait_rate:.0%} at KL "
                    f"{best.kl_first:.3g}"
                )
        except Cancelled:
            _stop(trials, study_file)
        finalists = _finalists(trials, request.kl_budget)
        ctx.progress(
            "calibrate",
            f"measuring the chosen ablation on all {len(trait_ids)} held-out prompts and {len(neutral_ids)} "
            f"neutral prompts (the best {len(finalists)} of the screening, where the whole sets may rank them "
            "otherwise)",
        )
        try:
            plans = [plan(t.model_dump(include=set(space))) for t in finalists]
            every_answer = judge(plans, trait_ids)
            every_kl = _first_kls(model, neutral_items, plans, ctx)
            whole = [
                t.model_copy(update={"trait_rate": _rate(answers, markers), "kl_first": kl})
                for t, answers, kl in zip(finalists, every_answer, every_kl)
            ]
            asked = [t.model_dump(include=set(space)) for t in finalists]
            for _ in range(STEP_BACKS):
                over = [i for i, t in enumerate(whole) if t.kl_first > request.kl_budget]
                if not over:
                    break
                for i in over:
                    factor = math.sqrt(request.kl_budget / whole[i].kl_first) * STEP_MARGIN
                    asked[i] = {**asked[i], "peak_weight": asked[i]["peak_weight"] * factor}
                    plans[i] = plan(asked[i])
                ctx.progress(
                    "calibrate",
                    f"stepping back the weights of {len(over)} of the {len(finalists)} that spend more than the "
                    f"budget on the whole neutral set",
                )
                answers = judge([plans[i] for i in over], trait_ids)
                kls = _first_kls(model, neutral_items, [plans[i] for i in over], ctx)
                for i, texts, kl in zip(over, answers, kls):
                    every_answer[i] = texts
                    whole[i] = whole[i].model_copy(
                        update={
                            "peak_weight": asked[i]["peak_weight"],
                            "trait_rate": _rate(texts, markers),
                            "kl_first": kl,
                        }
                    )
            pick = min(range(len(whole)), key=lambda i: _rank(whole[i], request.kl_budget))
            params, chosen, trait_answers = asked[pick], plans[pick], every_answer[pick]
            kl_first = whole[pick].kl_first
            if whole[pick].kl_first <= request.kl_budget:
                ctx.progress(
                    "calibrate",
                    f"trying the chosen ablation's weights at {', '.join(f'{t:g}' for t in TRIMS)} of themselves",
                )
                rungs = [{**params, "peak_weight": params["peak_weight"] * t} for t in TRIMS]
                rung_plans = [plan(rung) for rung in rungs]
                rung_answers = judge(rung_plans, trait_ids)
                rung_kls = _first_kls(model, neutral_items, rung_plans, ctx)
                rates = [_rate(texts, markers) for texts in rung_answers]
                lowest = _trimmed(rates, rung_kls, whole[pick].trait_rate, kl_first)
                if lowest is not None:
                    ctx.log(
                        f"the chosen ablation's weights at {TRIMS[lowest]:g} of themselves refuse as few "
                        f"({rates[lowest]:.0%}) at first-token KL {rung_kls[lowest]:.3g} rather than {kl_first:.3g}: "
                        "taken"
                    )
                    params, chosen = rungs[lowest], rung_plans[lowest]
                    trait_answers, kl_first = rung_answers[lowest], rung_kls[lowest]
            other_answers = judge([{}, chosen], other_ids)
            examples = judge([chosen], trait_ids[:EXAMPLES], whole=True)[0]
            continuations = greedy_continuations(
                model, neutral_ids, CONTINUATION_TOKENS, codec.eos_ids, check_cancelled=ctx.check_cancelled
            )
            mean = _mean_kls(model, list(zip(neutral_ids, continuations)), chosen, ctx)
        except Cancelled:
            _stop(trials, study_file)
    record = Ablation(
        direction_layer=int(params["direction_layer"]),
        profile=profile_of(params),
        markers=list(markers),
        trait_prompts=len(trait_ids),
        trait_rate_before=base_rate,
        trait_rate=_rate(trait_answers, markers),
        answered_rate_before=_rate(other_answers[0], markers),
        answered_rate=_rate(other_answers[1], markers),
        kl_first=kl_first,
        kl=mean,
        examples_before=base_answers[:EXAMPLES],
        examples=examples,
        trials=trials,
    )
    if record.kl_first > request.kl_budget:
        ctx.warn(
            f"no ablation tried stays within the KL budget of {request.kl_budget:g}, even with its weights "
            f"stepped back; the chosen one costs {record.kl_first:.3g}"
        )
    ctx.log(
        f"chose the direction at layer {record.direction_layer} ablated with {_profile_words(record.profile)}: "
        f"{record.trait_rate:.0%} of held-out trait prompts refused (from {record.trait_rate_before:.0%}), "
        f"first-token KL {record.kl_first:.3g} on {len(neutral_ids)} neutral prompts"
    )
    vector = projected(directions, record.direction_layer)
    artifact = SteeringArtifact(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        model_fingerprint=checkpoint.fingerprint,
        trait_name=pair_set.trait_name or "trait",
        method="caa",
        hidden_size=checkpoint.config.hidden_size,
        precision=request.precision,
        chat_template=codec.decision,
        adapter=str(request.adapter) if request.adapter else None,
        metadata={
            "selection": f"ablation calibrated over {len(trials)} trials",
            "direction": "caa less its component along the mean state of the answered (negative) prompts",
        },
        vectors=[vector],
        calibration=Calibration(
            kl_budget=request.kl_budget,
            neutral=bundled_name(request.neutral or example_path(NEUTRAL)),
            neutral_sha256=digest,
            neutral_prompts=len(neutral_ids),
            continuation_tokens=CONTINUATION_TOKENS,
            holdout_pairs=len(held),
            fit_pairs=len(fit),
            seed=request.seed,
            baseline=Point(strength=0.0, kl=0.0, kl_first=0.0, behaviour=0.0, preferred=0.0, probability=0.0),
            positive=None,
            negative=None,
            trials=[],
            ablation=record,
        ),
        strength_unit="spread",
    )
    save_artifact(request.output, artifact)
    study_file.unlink(missing_ok=True)
    return AblationResult(**summarize(artifact).model_dump(), front=ablation_front(trials))


def projected(directions: Directions, layer: int) -> LayerVector:
    """The caa direction at ``layer`` less its component along the mean state of the answered prompts (heretic's
    ``orthogonalize_direction``), so that ablating it leaves what every answer carries alone."""
    import torch

    from ster.engine.steering.directions import score
    from ster.engine.steering.floats import f32_values

    fitted = directions.of(layer, "caa")
    column = directions.columns[layer]
    v = torch.tensor(fitted.vector, dtype=torch.float64)
    g = directions.negatives[:, column].double().mean(0)
    g = g / g.norm()
    w = v - (v @ g) * g
    w = w / w.norm()
    scores = score(w.float(), directions.positives[:, column], directions.negatives[:, column])
    return fitted.model_copy(
        update={
            "vector": f32_values(w.float().numpy()),
            "train_accuracy": scores.accuracy,
            "train_margin": scores.margin,
        }
    )


def _ask(space: dict[str, Any], trials: list[AblationTrial], count: int, seed: int) -> list[dict[str, Any]]:
    """The next ``count`` candidates: Optuna's TPE sampler told every trial so far, seeded by how many there are,
    so the candidates depend on nothing but the study's trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        directions=["minimize", "minimize"],
        sampler=optuna.samplers.TPESampler(
            seed=seed * 100_003 + len(trials), multivariate=True, n_startup_trials=BATCH
        ),
    )
    for trial in trials:
        study.add_trial(
            optuna.trial.create_trial(
                params=trial.model_dump(include=set(space)),
                distributions=space,
                values=[trial.trait_rate, trial.kl_first],
            )
        )
    asked = [study.ask(space) for _ in range(count)]
    return [dict(trial.params) for trial in asked]


def _finalists(trials: list[AblationTrial], budget: float) -> list[AblationTrial]:
    """``FINALISTS`` trials: the best within the budget and the best just over it (see ``FINALISTS``), each half
    filled from the other where one has too few, in rank order."""
    by_rate = sorted(trials, key=lambda t: (t.trait_rate, t.kl_first))
    within = [t for t in by_rate if t.kl_first <= budget]
    near = [t for t in by_rate if budget < t.kl_first <= STEP_REACH * budget]
    picked = within[: FINALISTS // 2] + near[: FINALISTS // 2]
    rest = [t for t in sorted(trials, key=lambda t: _rank(t, budget)) if t not in picked]
    return picked + rest[: FINALISTS - len(picked)]


def _trimmed(rates: list[float], kls: list[float], rate: float, kl: float) -> int | None:
    """Of the rungs (the chosen weights scaled down, ``TRIMS``), the one of lowest KL that refuses no more than
    the chosen ablation (``rate``) and costs less than it (``kl``); None where none does."""
    fits = [i for i, (r, k) in enumerate(zip(rates, kls)) if r <= rate and k < kl]
    return min(fits, key=lambda i: kls[i]) if fits else None


def _rank(trial: AblationTrial, budget: float) -> tuple[bool, float, float]:
    """Within the budget first; then the lower trait rate; then the lower KL."""
    return trial.kl_first > budget, trial.trait_rate, trial.kl_first


def _rate(texts: list[str], markers: tuple[str, ...]) -> float:
    return sum(refuses(text, markers) for text in texts) / max(len(texts), 1)


def _first_kls(
    model: Decoder, items: list[tuple[list[int], list[int]]], plans: list[Plan], ctx: JobContext
) -> list[float]:
    """Each plan's mean first-token KL from the unedited model over ``items`` (prompt, its first token)."""
    from ster.engine.steering.measures import Rows, kl_costs

    costs = kl_costs(model, items, Rows.of(model, [{}, *plans]), ctx.check_cancelled)
    return [sum(cost.first[r] for cost in costs) / max(len(costs), 1) for r in range(1, len(plans) + 1)]


def _mean_kls(model: Decoder, items: list[tuple[list[int], list[int]]], chosen: Plan, ctx: JobContext) -> float:
    from ster.engine.steering.measures import Rows, kl_costs

    costs = kl_costs(model, items, Rows.of(model, [{}, chosen]), ctx.check_cancelled)
    return sum(cost.mean[1] for cost in costs) / max(len(costs), 1)


def _profile_words(profile: Profile) -> str:
    return (
        f"weight {profile.peak_weight:.3g} at layer {profile.peak_layer:.3g}, falling to {profile.min_weight or 0:.3g} "
        f"over {profile.falloff or 0:.3g} layers"
    )


def _stop(trials: list[AblationTrial], path: Path) -> None:

    stopped(trials, path)
