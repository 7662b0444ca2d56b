"""Fitting a direction from paired states, and judging one.

Every method returns a unit-length f32 direction in the residual stream of one layer.
Arithmetic runs in f64: a mean of hundreds of differences, a 2000-term norm or a
projection in f32 loses its low bits, and the scores are compared across candidates.

* ``caa``: the mean over pairs of (positive − negative), normalised.
* ``pca``: the leading principal direction of the pairwise differences after
  subtracting their mean, oriented so the mean difference projects positively.
* ``logistic``: an L2-regularised logistic-regression probe (positives 1, negatives 0),
  its weight vector normalised. The states are centred on their mean and divided by
  their mean norm (one scalar, so the direction is unchanged), and the loss is the
  mean log-loss plus ``LOGISTIC_L2 / 2 · |w|²``, minimised from zero with L-BFGS in
  f64 to a gradient tolerance of 1e-10. The solution is unique, so the fit is
  deterministic.

Fitting is refused when the differences carry no signal, rather than reporting an
arbitrary direction at a perfect score: for ``caa`` and ``logistic`` when every pair's
difference (and for ``caa`` their mean) is within :data:`NO_SIGNAL` of the states' mean
norm of zero, for ``pca`` when every difference is that close to their mean (no
variance, as five copies of one pair give).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ster.engine.protocol.errors import Refusal

Method = Literal["caa", "pca", "logistic"]
METHODS: tuple[Method, ...] = ("caa", "pca", "logistic")
LOGISTIC_L2 = 0.01
"""The L2 penalty of the logistic probe, on features scaled to unit mean norm."""
NO_SIGNAL = 1e-4
"""Below this fraction of the states' mean norm a difference is rounding, not signal. Two reads of one
text agree exactly (in any batch, f32 or bf16); real pairs' differences, and their spread about their
mean, measured 4e-3 to 0.2 of the norm on the toy and on SmolLM2-135M at every layer."""


@dataclass(frozen=True)
class Scores:
    accuracy: float
    """Share of pairs whose positive projects strictly higher than its negative."""
    margin: float
    """Mean over pairs of (positive·v − negative·v)."""


def fit(method: Method, positives: Tensor, negatives: Tensor) -> Tensor:
    """A unit f32 direction [D] from paired states [N, D]."""
    pos, neg = positives.double(), negatives.double()
    _check_signal(method, pos - neg, mean_norm(pos, neg))
    if method == "caa":
        direction = (pos - neg).mean(0)
    elif method == "pca":
        direction = _pca(pos - neg)
    else:
        direction = _logistic(pos, neg)
    norm = direction.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise Refusal(f"the {method} fit gave a direction that is zero or not finite, so there is nothing to write")
    return (direction / norm).float()


def _check_signal(method: Method, diffs: Tensor, scale: float) -> None:
    """Refuse differences no direction can be read from, relative to the states' scale."""
    floor = NO_SIGNAL * scale
    largest = float(diffs.norm(dim=1).max())
    if largest <= floor:
        raise Refusal(
            f"{method} finds no direction: every pair's two sides read the same (the largest "
            f"difference is {largest:.3g}, against states of norm {scale:.3g})"
        )
    mean = diffs.mean(0)
    if method == "pca" and diffs.shape[0] >= 2:
        spread = float((diffs - mean).norm(dim=1).max())
        if spread <= floor:
            raise Refusal(
                f"pca finds no direction: the pairs' differences do not vary (each lies within "
                f"{spread:.3g} of their mean, against states of norm {scale:.3g}), so every direction "
                f"explains them equally; remove duplicate pairs (pairs inspect finds them) or use caa"
            )
    if method == "caa" and float(mean.norm()) <= floor:
        raise Refusal(
            f"caa finds no direction: the pairs' differences cancel out (their mean has norm "
            f"{float(mean.norm()):.3g}, against states of norm {scale:.3g})"
        )


def _pca(diffs: Tensor) -> Tensor:
    if diffs.shape[0] < 2:
        raise Refusal("pca needs at least 2 pairs: one difference has no principal direction once its mean is removed")
    mean = diffs.mean(0)
    _, _, right = torch.linalg.svd(diffs - mean, full_matrices=False)
    leading = right[0]
    return -leading if leading @ mean < 0 else leading


def _logistic(pos: Tensor, neg: Tensor) -> Tensor:
    states = torch.cat([pos, neg])  # [2N, D] f64
    labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).double()
    centred = states - states.mean(0)
    scaled = centred / centred.norm(dim=1).mean().clamp_min(1e-12)
    weights = torch.zeros(states.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weights, bias],
        lr=1,
        max_iter=500,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def loss() -> Tensor:
        optimizer.zero_grad()
        logits = scaled @ weights + bias
        value = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        value = value + LOGISTIC_L2 / 2 * weights @ weights
        value.backward()
        return value

    with torch.enable_grad():
        optimizer.step(loss)
    return weights.detach()


def score(direction: Tensor, positives: Tensor, negatives: Tensor) -> Scores:
    """Pair-ordering accuracy and mean projection margin of ``direction`` over paired states."""
    v = direction.double()
    gaps = positives.double() @ v - negatives.double() @ v  # [N]
    return Scores(accuracy=float((gaps > 0).double().mean()), margin=float(gaps.mean()))


def mean_norm(*states: Tensor) -> float:
    """Mean Euclidean norm of the states, in f64: the scale a strength is read against."""
    return float(torch.cat([s.double() for s in states]).norm(dim=1).mean())
