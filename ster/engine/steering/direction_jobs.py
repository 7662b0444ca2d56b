"""The steering jobs that fit and judge directions: ``train``, ``optimize``, ``evaluate``, ``inspect``.

Each reads pair states once, exactly as ``extract`` reads a prompt (through the chat
template decision, last token, after each selected block), with the shared prefix of a
pair's two sides run once. ``optimize`` fits all of its candidates from that one read,
so it costs about one ``train`` over the same layers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from ster.engine.model.adapters.apply import CheckedAdapter, check_adapter
from ster.engine.model.context import encode_pairs
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.pairs.model import PairSet
from ster.engine.pairs.workspace import load_pairs_or_active
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import ARTIFACT, check_output_file
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.artifact import (
    ArtifactSummary,
    LayerVector,
    SteeringArtifact,
    open_artifact,
    save_artifact,
    summarize,
)
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.requests import EvaluateRequest, OptimizeRequest, TrainRequest

if TYPE_CHECKING:
    from ster.engine.steering.directions import Method

ONE_PAIR_HOLDOUT = (
    "a one-pair holdout scores every candidate 0 or 1, so this ranking separates almost nothing; "
    "add pairs to make the choice mean something"
)


def _encode(checkpoint: Checkpoint, pair_set: PairSet) -> list[tuple[list[int], list[int]]]:
    """Both sides of every pair in the model's tokens, each refused when it runs past the context."""
    return encode_pairs(checkpoint.codec, [(p.positive, p.negative) for p in pair_set.pairs], checkpoint.context)


def _artifact(
    checkpoint: Checkpoint,
    pair_set: PairSet,
    method: Method,
    vectors: list[LayerVector],
    adapter: CheckedAdapter | None,
    metadata: dict[str, str] | None = None,
) -> SteeringArtifact:
    return SteeringArtifact(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        model_fingerprint=checkpoint.fingerprint,
        trait_name=pair_set.trait_name,
        method=method,
        hidden_size=checkpoint.config.hidden_size,
        precision=checkpoint.request.precision,
        chat_template=checkpoint.codec.decision,
        adapter=str(adapter.path) if adapter else None,
        metadata=metadata or {},
        vectors=vectors,
        strength_unit="spread" if all(v.activation_spread for v in vectors) else "norm",
    )


def train_job(request: TrainRequest, ctx: JobContext) -> ArtifactSummary:
    _, pair_set = load_pairs_or_active(request.pairs)
    check_output_file(request.output, ARTIFACT, ctx.log)
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    encoded = _encode(checkpoint, pair_set)
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.steering import fitting  # torch, once every input has been checked

    spread = fitting.Spread(layers, checkpoint.config.hidden_size)
    positives, negatives = fitting.read_pairs(ctx, checkpoint, encoded, layers, request.batch_size, adapter, spread)
    spreads = spread.values()
    vectors = []
    for column, layer in enumerate(layers):
        ctx.check_cancelled()
        ctx.progress("fit", f"fitting {request.method} at layer {layer}", column + 1, len(layers))
        vectors.append(
            fitting.layer_vector(layer, request.method, positives[:, column], negatives[:, column], spreads[layer])
        )
    artifact = _artifact(checkpoint, pair_set, request.method, vectors, adapter)
    ctx.check_cancelled()
    save_artifact(request.output, artifact)
    return summarize(artifact)


class Candidate(BaseModel):
    layer: int
    method: Literal["caa", "pca", "logistic"]
    holdout_accuracy: float
    holdout_margin: float
    """Mean holdout gap along the direction, in the residual stream's own units at this layer."""
    holdout_separation: float | None
    """``holdout_margin`` over the pooled standard deviation of the holdout states' projections within each side
    (Fisher's criterion): how many spreads of trait-unrelated variation apart the two sides lie along the
    direction. Scale-free; null when the holdout cannot measure a spread (one pair, or no spread at all)."""
    relative_margin: float
    """``holdout_margin`` over the layer's activation norm (over the fitting pairs): scale-free, the tie-break
    when no separation can be measured."""
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
        raise Refusal(
            f"optimize needs at least 4 pairs, so that some are held out to rank on; pair set {path} has {total}"
        )
    check_output_file(request.output, ARTIFACT, ctx.log)
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    fit_count = (total * 8) // 10
    ctx.log(f"fitting each candidate on {fit_count} pairs and ranking on a {total - fit_count}-pair holdout")
    if total - fit_count == 1:
        ctx.warn(ONE_PAIR_HOLDOUT)
    encoded = _encode(checkpoint, pair_set)
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.steering import fitting  # torch, once every input has been checked

    spread = fitting.Spread(layers, checkpoint.config.hidden_size)
    positives, negatives = fitting.read_pairs(ctx, checkpoint, encoded, layers, request.batch_size, adapter, spread)
    candidates = [
        Candidate(**numbers, selected=False) for numbers in fitting.rank(ctx, layers, positives, negatives, fit_count)
    ]
    best = max(range(len(candidates)), key=lambda i: _rank_key(candidates[i], i))
    winner = candidates[best] = candidates[best].model_copy(update={"selected": True})
    column = layers.index(winner.layer)
    ctx.progress("fit", f"refitting {winner.method} at layer {winner.layer} on all {total} pairs")
    vector = fitting.layer_vector(
        winner.layer, winner.method, positives[:, column], negatives[:, column], spread.values()[winner.layer]
    )
    sentence = (
        f"chosen over {len(candidates)} candidates on a {total - fit_count}-pair holdout, "
        f"then refitted on all {total} pairs"
    )
    artifact = _artifact(checkpoint, pair_set, winner.method, [vector], adapter, {"selection": sentence})
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
    return (
        candidate.holdout_accuracy,
        -math.inf if separation is None else separation,
        candidate.relative_margin,
        -index,
    )


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
    adapter: str | None
    """The LoRA adapter the pairs were read through, or null for the bare checkpoint."""
    layers: list[LayerScore]


def evaluate_job(request: EvaluateRequest, ctx: JobContext) -> EvaluateResult:
    _, pair_set = load_pairs_or_active(request.pairs)
    checkpoint = model_store(ctx).open(request, ctx)
    artifact = open_artifact(ctx, request.vector, checkpoint)
    vectors = artifact.by_layer()
    layers = sorted(vectors)
    encoded = _encode(checkpoint, pair_set)
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.steering import fitting  # torch, once every input has been checked

    positives, negatives = fitting.read_pairs(ctx, checkpoint, encoded, layers, request.batch_size, adapter)
    scores = [
        LayerScore(layer=layer, accuracy=accuracy, margin=margin)
        for layer, accuracy, margin in fitting.layer_scores(vectors, positives, negatives)
    ]
    return EvaluateResult(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        trait_name=artifact.trait_name,
        method=artifact.method,
        pair_count=len(pair_set.pairs),
        chat_template=checkpoint.codec.decision,
        precision=request.precision,
        adapter=str(request.adapter) if adapter else None,
        layers=scores,
    )
