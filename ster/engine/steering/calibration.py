"""The torch side of ``calibrate``: fitting every candidate's directions and measuring a ladder of strengths.

:mod:`ster.engine.steering.calibrate` holds the job and the search's plan, which check every input first and
import this module only then.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.steering.artifact import LayerVector
from ster.engine.steering.calibration_record import Point
from ster.engine.steering.directions import Method
from ster.engine.steering.fitting import layer_vector
from ster.engine.steering.intervention import Plan, added
from ster.engine.steering.measures import Rows, behaviours, kl_costs, perplexity


@dataclass(frozen=True)
class Probes:
    """What a ladder is measured on: neutral prompts with the unsteered model's continuations, and held-out pairs."""

    neutral: list[tuple[list[int], list[int]]]
    pairs: list[tuple[list[int], list[int]]]


class Directions:
    """Per (layer, method), the direction fitted on the fitting pairs' states, fitted once and kept."""

    def __init__(
        self, layers: list[int], positives: Tensor, negatives: Tensor, spreads: dict[int, float | None]
    ) -> None:
        self.columns = {layer: column for column, layer in enumerate(layers)}
        self.positives, self.negatives, self.spreads = positives, negatives, spreads
        self.fitted: dict[tuple[int, str], LayerVector] = {}

    def of(self, layer: int, method: Method) -> LayerVector:
        key = (layer, method)
        if key not in self.fitted:
            column = self.columns[layer]
            self.fitted[key] = layer_vector(
                layer, method, self.positives[:, column], self.negatives[:, column], self.spreads[layer]
            )
        return self.fitted[key]


def measure(
    model: Decoder,
    vectors: list[LayerVector],
    strengths: list[float],
    probes: Probes,
    check_cancelled: Callable[[], None],
) -> list[Point]:
    """Each strength (a multiple of each layer's spread, else of its norm, signed; 0 allowed) measured as one row of
    every forward: mean KL over the neutral prompts (over the continuation and at its first position) and
    behaviour over the pairs."""
    directions = {v.layer: v.vector for v in vectors}
    plans = [added(directions, {v.layer: s * unit_of(v) for v in vectors}) for s in strengths]
    return measure_plans(model, plans, strengths, probes, check_cancelled)


def measure_plans(
    model: Decoder,
    plans: list[Plan],
    strengths: list[float],
    probes: Probes,
    check_cancelled: Callable[[], None],
) -> list[Point]:
    """:func:`measure` with each row's plan given (steering, ablation or clamping), ``strengths`` naming the rows;
    row 0 is the unsteered model, which every KL is measured from."""
    assert not plans[0], "a ladder starts unedited: the row every KL is measured from"
    rows = Rows.of(model, plans)
    kl = [0.0] * len(strengths)
    first = [0.0] * len(strengths)
    for cost in kl_costs(model, probes.neutral, rows, check_cancelled):
        kl = [a + b for a, b in zip(kl, cost.mean)]
        first = [a + b for a, b in zip(first, cost.first)]
    gaps: list[list[float]] = [[] for _ in strengths]
    for pair in behaviours(model, probes.pairs, rows, check_cancelled):
        for row, gap in enumerate(pair):
            gaps[row].append(gap)
    n = max(len(probes.neutral), 1)
    return [
        Point(
            strength=s,
            kl=kl[i] / n,
            kl_first=first[i] / n,
            behaviour=_mean(gaps[i]),
            preferred=sum(g > 0 for g in gaps[i]) / max(len(gaps[i]), 1),
            probability=_mean([_sigmoid(g) for g in gaps[i]]),
        )
        for i, s in enumerate(strengths)
    ]


def unit_of(vector: LayerVector) -> float:
    """What ``1x`` is at the vector's layer: its activation spread, or its norm where no spread is recorded."""
    return vector.activation_spread or vector.activation_norm or 0.0


def fluency(model: Decoder, prompts: list[list[int]], texts: dict[float, list[list[int]]]) -> dict[float, float | None]:
    """Per strength, the unsteered model's perplexity of its texts (token-weighted over the prompts) over that of
    the strength-0 texts; None where a strength's texts are all empty."""

    def nll(generated: list[list[int]]) -> float | None:
        total = count = 0.0
        for prompt, text in zip(prompts, generated):
            value = perplexity(model, prompt, text)
            if value is not None:
                total += math.log(value) * len(text)
                count += len(text)
        return total / count if count else None

    base = nll(texts[0.0])
    ratios: dict[float, float | None] = {}
    for strength, generated in texts.items():
        value = nll(generated)
        ratios[strength] = None if value is None or base is None else math.exp(value - base)
    return ratios


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0
