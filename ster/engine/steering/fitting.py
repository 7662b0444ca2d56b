"""The torch side of ``train``, ``optimize`` and ``evaluate``: reading pair states, fitting and scoring.

:mod:`ster.engine.steering.direction_jobs` holds the jobs, which check every input (the pair set,
the output, the model's config and tokenizer, the layers, each side's length) before they
import this module, so a bad input is refused before torch is imported.
"""

from __future__ import annotations

import math
from typing import TypedDict

import torch
from torch import Tensor

from ster.engine.model.adapters.apply import CheckedAdapter, adapted
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.activations import Spread, read_pair_states

__all__ = ["Spread", "layer_vector", "read_pairs"]
from ster.engine.steering.artifact import LayerVector
from ster.engine.steering.directions import METHODS, Method, fit, mean_norm, score
from ster.engine.steering.floats import f32_values


def read_pairs(
    ctx: JobContext,
    checkpoint: Checkpoint,
    encoded: list[tuple[list[int], list[int]]],
    layers: list[int],
    batch_size: int,
    adapter: CheckedAdapter | None = None,
    spread: Spread | None = None,
) -> tuple[Tensor, Tensor]:
    """Positive and negative states [N, len(layers), D] of every encoded pair, read through ``adapter`` if given;
    with ``spread``, every position's state goes into its sums too."""
    decoder = model_store(ctx).decoder(checkpoint, ctx)

    def on_batch(done: int, total: int) -> None:
        ctx.progress("read", f"reading pair {done}/{total}", done, total)

    with adapted(ctx, decoder, adapter, checkpoint):
        return read_pair_states(
            decoder,
            encoded,
            layers,
            batch_size=batch_size,
            on_batch=on_batch,
            check_cancelled=ctx.check_cancelled,
            spread=spread,
        )


def layer_vector(
    layer: int, method: Method, positives: Tensor, negatives: Tensor, spread: float | None = None
) -> LayerVector:
    """Fit one layer's direction on [N, D] states and score it on the same pairs; ``spread`` is the layer's
    RMS spread over every position of the fitting texts, when it was measured."""
    direction = fit(method, positives, negatives)
    scores = score(direction, positives, negatives)
    return LayerVector(
        layer=layer,
        vector=f32_values(direction.numpy()),
        train_accuracy=scores.accuracy,
        train_margin=scores.margin,
        activation_norm=mean_norm(positives, negatives),
        activation_spread=spread,
    )


def separation(direction: Tensor, positives: Tensor, negatives: Tensor, margin: float) -> float | None:
    """``margin`` over the pooled within-side standard deviation of the states' projections onto ``direction``;
    None with fewer than two pairs or no spread."""
    if len(positives) < 2:
        return None
    v = direction.double()
    sides = [positives.double() @ v, negatives.double() @ v]
    squares = sum(float(((side - side.mean()) ** 2).sum()) for side in sides)
    spread = math.sqrt(squares / (2 * len(positives) - 2))
    return margin / spread if spread > 0 else None


class Ranked(TypedDict):
    """A candidate's numbers, as ``direction_jobs.Candidate`` names them."""

    layer: int
    method: Method
    holdout_accuracy: float
    holdout_margin: float
    holdout_separation: float | None
    relative_margin: float


def rank(ctx: JobContext, layers: list[int], positives: Tensor, negatives: Tensor, fit_count: int) -> list[Ranked]:
    """Fit every method at every layer on the first pairs and score it on the rest, in search order."""
    candidates: list[Ranked] = []
    for column, layer in enumerate(layers):
        ctx.check_cancelled()
        ctx.progress("fit", f"fitting and ranking candidates at layer {layer}", column + 1, len(layers))
        fit_pos, fit_neg = positives[:fit_count, column], negatives[:fit_count, column]
        held_pos, held_neg = positives[fit_count:, column], negatives[fit_count:, column]
        norm = mean_norm(fit_pos, fit_neg)
        for method in METHODS:
            direction = fit(method, fit_pos, fit_neg)
            scores = score(direction, held_pos, held_neg)
            candidates.append(
                {
                    "layer": layer,
                    "method": method,
                    "holdout_accuracy": scores.accuracy,
                    "holdout_margin": scores.margin,
                    "holdout_separation": separation(direction, held_pos, held_neg, scores.margin),
                    "relative_margin": scores.margin / norm,
                }
            )
    return candidates


def layer_scores(
    vectors: dict[int, list[float]], positives: Tensor, negatives: Tensor
) -> list[tuple[int, float, float]]:
    """(layer, accuracy, margin) of each layer's direction on the pairs' states, layers ascending."""
    scored = []
    for column, layer in enumerate(sorted(vectors)):
        result = score(torch.tensor(vectors[layer]), positives[:, column], negatives[:, column])
        scored.append((layer, result.accuracy, result.margin))
    return scored
