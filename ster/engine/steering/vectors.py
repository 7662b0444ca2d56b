"""The steering jobs that fit and judge directions: ``train``, ``optimize``, ``evaluate``, ``inspect``.

Each reads pair states once, exactly as ``extract`` reads a prompt (through the chat
template decision, last token, after each selected block), with the shared prefix of a
pair's two sides run once. ``optimize`` fits all of its candidates from that one read,
so it costs about one ``train`` over the same layers.
"""

from __future__ import annotations

import math

from pydantic import BaseModel
import torch
from torch import Tensor

from ster.engine.model.context import encode_pairs
from ster.engine.steering.activations import read_pair_states
from ster.engine.steering.artifact import (ArtifactSummary, LayerVector, SteeringArtifact, open_artifact,
                                  save_artifact, summarize)
from ster.engine.steering.directions import METHODS, Method, fit, mean_norm, score
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import ARTIFACT, check_output_file
from ster.engine.steering.floats import f32_values
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.layers import LayerSpec
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.pairs.model import PairSet
from ster.engine.pairs.workspace import load_pairs_or_active
from ster.engine.steering.requests import EvaluateRequest, OptimizeRequest, TrainRequest

ONE_PAIR_HOLDOUT = ("a one-pair holdout scores every candidate 0 or 1, so this ranking separates almost nothing; "
                    "add pairs to make the choice mean something")


def read_pairs(ctx: JobContext, checkpoint: Checkpoint, pair_set: PairSet, layers: list[int],
               batch_size: int) -> tuple[Tensor, Tensor]:
    """Positive and negative states [N, len(layers), D] of every pair."""
    codec = checkpoint.codec
    encoded = encode_pairs(codec, [(p.positive, p.negative) for p in pair_set.pairs], checkpoint.context)
    decoder = model_store(ctx).decoder(checkpoint, ctx)

    def on_batch(done: int, total: int) -> None:
        ctx.progress("read", f"reading pair {done}/{total}", done, total)

    return read_pair_states(decoder, encoded, layers, batch_size=batch_size, on_batch=on_batch,
                            check_cancelled=ctx.check_cancelled)


def layer_vector(layer: int, method: Method, positives: Tensor, negatives: Tensor) -> LayerVector:
    """Fit one layer's direction on [N, D] states and score it on the same pairs."""
    direction = fit(method, positives, negatives)
    scores = score(direction, positives, negatives)
    return LayerVector(layer=layer, vector=f32_values(direction.numpy()), train_accuracy=scores.accuracy,
                       train_margin=scores.margin, activation_norm=mean_norm(positives, negatives))


def _artifact(checkpoint: Checkpoint, pair_set: PairSet, method: str, vectors: list[LayerVector],
              metadata: dict[str, str] | None = None) -> SteeringArtifact:
    return SteeringArtifact(model=checkpoint.source.model, model_revision=checkpoint.source.revision,
                            model_fingerprint=checkpoint.fingerprint,
                            trait_name=pair_set.trait_name, method=method, hidden_size=checkpoint.config.hidden_size,
                            precision=checkpoint.request.precision, chat_template=checkpoint.codec.decision,
                            metadata=metadata or {}, vectors=vectors)


def train_job(request: TrainRequest, ctx: JobContext) -> ArtifactSummary:
    _, pair_set = load_pairs_or_active(request.pairs)
    check_output_file(request.output, ARTIFACT, ctx.log)
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    positives, negatives = read_pairs(ctx, checkpoint, pair_set, layers, request.batch_size)
    vectors = []
    for column, layer in enumerate(layers):
        ctx.check_cancelled()
        ctx.progress("fit", f"fitting {request.method} at layer {layer}", column + 1, len(layers))
        vectors.append(layer_vector(layer, request.method, positives[:, column], negatives[:, column]))
    artifact = _artifact(checkpoint, pair_set, request.method, vectors)
    ctx.check_cancelled()
    save_artifact(request.output, artifact)
    return summarize(artifact)


class Candidate(BaseModel):
    layer: int
    method: str
    holdout_accuracy: float
    holdout_margin: float
    """Mean holdout gap along the direction, in the residual stream's own units at this layer."""
    holdout_separation: float | None
    """``holdout_margin`` over the pooled standard deviation of the holdout states' projections within each side
    (Fisher's criterion): how many spreads of trait-unrelated variation apart the two sides lie along the
    direction. Scale-free; null when the holdout cannot measure a spread (one pair, or no spread at all)."""
    relative_margin: float
    """``holdout_margin`` over the layer's activation norm (over the fitting pairs): the gap in the unit of a
    relative strength (``0.3x``); the tie-break when no separation can be measured."""
    selected: bool


class Holdout(BaseModel):
    fit_pairs: int
    holdout_pairs: int


class Selection(BaseModel):
    holdout: Holdout
    candidates: list[Candidate]
    """In the order the search walked them: layers ascending, then caa, pca, logistic."""


class OptimizeResult(ArtifactSummary):
    selection: Selection


def optimize_job(request: OptimizeRequest, ctx: JobContext) -> OptimizeResult:
    path, pair_set = load_pairs_or_active(request.pairs)
    total = len(pair_set.pairs)
    if total < 4:
        raise Refusal(f"optimize needs at least 4 pairs, so that some are held out to rank on; "
                      f"pair set {path} has {total}")
    check_output_file(request.output, ARTIFACT, ctx.log)
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    fit_count = (total * 8) // 10
    ctx.log(f"fitting each candidate on {fit_count} pairs and ranking on a {total - fit_count}-pair holdout")
    if total - fit_count == 1:
        ctx.warn(ONE_PAIR_HOLDOUT)
    positives, negatives = read_pairs(ctx, checkpoint, pair_set, layers, request.batch_size)
    candidates = _rank(ctx, layers, positives, negatives, fit_count)
    best = max(range(len(candidates)), key=lambda i: _rank_key(candidates[i], i))
    winner = candidates[best] = candidates[best].model_copy(update={"selected": True})
    column = layers.index(winner.layer)
    ctx.progress("fit", f"refitting {winner.method} at layer {winner.layer} on all {total} pairs")
    vector = layer_vector(winner.layer, winner.method, positives[:, column], negatives[:, column])  # type: ignore[arg-type]
    sentence = (f"chosen over {len(candidates)} candidates on a {total - fit_count}-pair holdout, "
                f"then refitted on all {total} pairs")
    artifact = _artifact(checkpoint, pair_set, winner.method, [vector], {"selection": sentence})
    ctx.check_cancelled()
    save_artifact(request.output, artifact)
    selection = Selection(holdout=Holdout(fit_pairs=fit_count, holdout_pairs=total - fit_count), candidates=candidates)
    return OptimizeResult(**summarize(artifact).model_dump(), selection=selection)


def _rank_key(candidate: Candidate, index: int) -> tuple[float, float, float, int]:
    """Holdout accuracy, then separation, then relative margin, then search order.

    Residual norms grow with depth (about 30 to 900 over SmolLM2-135M's layers), and a margin in the stream's
    own units grows with them, so breaking accuracy ties on raw margin always picks the deepest layer, where
    steering breaks the text rather than moving it. Separation is scale-free: it measures the gap against the
    spread of the states along the same direction, so it peaks where the trait is a clean linear feature of the
    layer (layer 21 of SmolLM2-135M's 30, which steers; layer 2 of the toy's 4). The margin over the activation
    norm is scale-free too, but it favours layers whose norm is small for reasons unrelated to the trait (the
    toy's layer 0, where a push breaks the text)."""
    separation = candidate.holdout_separation
    return (candidate.holdout_accuracy, -math.inf if separation is None else separation,
            candidate.relative_margin, -index)


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


def _rank(ctx: JobContext, layers: list[int], positives: Tensor, negatives: Tensor, fit_count: int) -> list[Candidate]:
    """Fit every method at every layer on the first pairs and score it on the rest, in search order."""
    candidates = []
    for column, layer in enumerate(layers):
        ctx.check_cancelled()
        ctx.progress("fit", f"fitting and ranking candidates at layer {layer}", column + 1, len(layers))
        fit_pos, fit_neg = positives[:fit_count, column], negatives[:fit_count, column]
        held_pos, held_neg = positives[fit_count:, column], negatives[fit_count:, column]
        norm = mean_norm(fit_pos, fit_neg)
        for method in METHODS:
            direction = fit(method, fit_pos, fit_neg)
            scores = score(direction, held_pos, held_neg)
            candidates.append(Candidate(layer=layer, method=method, holdout_accuracy=scores.accuracy,
                                        holdout_margin=scores.margin,
                                        holdout_separation=separation(direction, held_pos, held_neg, scores.margin),
                                        relative_margin=scores.margin / norm, selected=False))
    return candidates


class LayerScore(BaseModel):
    layer: int
    accuracy: float
    margin: float


class EvaluateResult(BaseModel):
    model: str
    model_revision: str | None
    trait_name: str
    method: str
    pair_count: int
    chat_template: str
    precision: str
    layers: list[LayerScore]


def evaluate_job(request: EvaluateRequest, ctx: JobContext) -> EvaluateResult:
    _, pair_set = load_pairs_or_active(request.pairs)
    checkpoint = model_store(ctx).open(request, ctx)
    artifact = open_artifact(ctx, request.vector, checkpoint)
    vectors = artifact.by_layer()
    layers = sorted(vectors)
    positives, negatives = read_pairs(ctx, checkpoint, pair_set, layers, request.batch_size)
    scores = []
    for column, layer in enumerate(layers):
        result = score(torch.tensor(vectors[layer]), positives[:, column], negatives[:, column])
        scores.append(LayerScore(layer=layer, accuracy=result.accuracy, margin=result.margin))
    return EvaluateResult(model=checkpoint.source.model, model_revision=checkpoint.source.revision,
                          trait_name=artifact.trait_name, method=artifact.method, pair_count=len(pair_set.pairs),
                          chat_template=checkpoint.codec.decision, precision=request.precision, layers=scores)
