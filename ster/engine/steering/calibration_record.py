"""What ``ster calibrate`` measured, as the artifact records it and as its study keeps it between runs.

Strengths here are signed multiples of each layer's activation spread (the artifact's relative unit, ``0.2x``). KL is
in nats: KL(unsteered ‖ steered) of the next-token distribution, as the mean over the positions of the
unsteered model's own greedy continuation of each neutral prompt (``kl``) and at the first of them
(``kl_first``), averaged over the prompts. Behaviour is the mean over held-out pairs of log p(positive side)
− log p(negative side) after the pair's shared prompt (see :mod:`ster.engine.steering.measures`).

Nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ster.engine.steering.intervention import Profile


class Point(BaseModel):
    """One strength of one candidate, measured."""

    model_config = ConfigDict(extra="forbid")
    strength: float
    kl: float
    kl_first: float
    behaviour: float
    preferred: float
    """Share of the held-out pairs whose positive side is the likelier."""
    probability: float
    """Mean over pairs of sigmoid(gap): the probability of the positive side between the two."""


class Trial(BaseModel):
    """One candidate: a layer or a contiguous range of layers and a method, measured at a ladder of strengths
    of both signs, and the strength per sign that meets the KL budget."""

    model_config = ConfigDict(extra="forbid")
    layers: list[int]
    method: Literal["caa", "pca", "logistic"]
    points: list[Point]
    """The ladder on the screening sets: 0 first, then each magnitude of ``LADDER`` positive, then negative."""
    positive: float | None
    """The positive strength at the budget (null when the direction moves behaviour the wrong way there)."""
    negative: float | None
    score: float
    """Behaviour moved toward each sign at its strength, summed over the two signs (its own way only)."""


class Side(BaseModel):
    """The chosen strength of one sign, measured on the whole neutral set and every held-out pair."""

    model_config = ConfigDict(extra="forbid")
    strength: float
    kl: float
    kl_first: float
    behaviour: float
    behaviour_shift: float
    """``behaviour`` minus the unsteered model's: positive is toward the pairs' positive side."""
    preferred: float
    probability: float
    fluency: float | None
    """The unsteered model's perplexity of the steered texts over its perplexity of the unsteered ones."""
    judge: float | None = None
    """The offline judge's mean p(yes) for the trait on the steered answers (null when no judge was run)."""
    example: str | None = None
    """The steered answer to the first generation prompt."""


class AblationTrial(BaseModel):
    """One candidate ablation, measured on the screening sets: the layer whose direction is ablated, its weight
    profile (the minimum as a share of the peak), the share of trait prompts still refused, and the first-token
    KL on the neutral prompts."""

    model_config = ConfigDict(extra="forbid")
    direction_layer: int
    peak_weight: float
    peak_layer: float
    min_share: float
    falloff: float
    trait_rate: float
    kl_first: float


class AblationPoint(BaseModel):
    """A measured candidate on the front: its profile, its trait rate and its cost."""

    direction_layer: int
    peak_weight: float
    peak_layer: float
    min_weight: float
    falloff: float
    trait_rate: float
    kl_first: float


class Ablation(BaseModel):
    """What ``calibrate --mode ablate`` chose and measured on every held-out prompt and neutral prompt."""

    model_config = ConfigDict(extra="forbid")
    direction_layer: int
    profile: Profile
    markers: list[str]
    """The refusal judge's markers (an answer holding one is a refusal)."""
    trait_prompts: int
    trait_rate_before: float
    """Share of the held-out trait prompts the unedited model's answers refuse."""
    trait_rate: float
    """The same, ablated."""
    answered_rate_before: float
    """Share of the held-out pairs' other prompts (answered ones) refused, unedited: what the ablation must not
    raise."""
    answered_rate: float
    kl_first: float
    """Mean first-token KL from the unedited model over every neutral prompt."""
    kl: float
    """Mean KL over the unedited model's own continuation of each neutral prompt."""
    examples_before: list[str]
    examples: list[str]
    """The first held-out trait prompts' answers, unedited and ablated."""
    trials: list[AblationTrial]


class Calibration(BaseModel):
    """The record a calibrated artifact carries: what was chosen, how it measured, and every trial."""

    model_config = ConfigDict(extra="forbid")
    kl_budget: float
    unit: str = "spread"
    """What the strengths here multiply at each layer: its ``activation_spread`` (or ``norm``, where none)."""
    neutral: str
    neutral_sha256: str
    neutral_prompts: int
    continuation_tokens: int
    holdout_pairs: int
    fit_pairs: int
    seed: int
    baseline: Point
    """The unsteered model on the same sets (strength 0)."""
    baseline_judge: float | None = None
    """The judge's mean p(yes) on the unsteered answers."""
    baseline_example: str | None = None
    judge: str | None = None
    """The judge model, or null when none was run."""
    judge_question: str | None = None
    judge_agreement: float | None = None
    """Share of held-out pairs whose positive answer the judge scores above the negative one: how far to trust it."""
    generation_prompts: int = 0
    """Held-out questions answered at each chosen strength, greedily, for fluency and the judge."""
    positive: Side | None
    negative: Side | None
    trials: list[Trial]
    ablation: Ablation | None = None
    """What ``calibrate --mode ablate`` chose (then the artifact ablates by default); absent for steering."""


def ablation_front(trials: list[AblationTrial]) -> list[AblationPoint]:
    """The trials no other beats on both the trait rate and the first-token KL, by KL (each point's minimum
    weight absolute, as the flags take it); the app draws it from a loaded artifact's record, without torch."""
    front: list[AblationPoint] = []
    best = float("inf")
    for trial in sorted(trials, key=lambda t: (t.kl_first, t.trait_rate)):
        if trial.trait_rate < best:
            point = trial.model_dump(exclude={"min_share"})
            front.append(AblationPoint(**point, min_weight=trial.min_share * trial.peak_weight))
            best = trial.trait_rate
    return front
