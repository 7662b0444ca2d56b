"""The ``sweep`` job: which strength? Steered text, effect and degeneracy at every strength.

For each strength (0, the unsteered baseline, always included) and each prompt, the
steered text is generated. Per strength:

* **effect**: each generated text is re-read by the *unsteered* model exactly as a
  pair side is read when a direction is fitted (encoded through the same chat-template
  decision, the last token's state after the artifact's layers), projected onto the
  direction in f64 and averaged over layers and the non-empty texts; the effect is
  that mean minus the baseline's. It says how far the text itself moved along the
  trait as the model reads it, rather than how hard the residual stream was pushed.
* **degeneracy**: distinct-2 (unique token bigrams over all bigrams, mean over prompts),
  the longest run of one repeated token, and the mean length.

A strength is *fluent* when its distinct-2 is at least ``DISTINCT_RATIO`` of the
baseline's, its longest run at most ``RUN_SLACK`` tokens longer than the baseline's,
and its mean length at least ``LENGTH_RATIO`` of the baseline's (collapsing to an
immediate end of text is over-steering too). The suggested strength for each sign is
the largest |strength| reached walking out from 0 before the first strength that is
not fluent; null when the first one already is not.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from pydantic import BaseModel, ValidationError

from ster.engine.steering.artifact import SteeringArtifact
from ster.engine.steering.activations import read_last_states
from ster.engine.model.codec import TextCodec
from ster.engine.model.context import encode_each, generation_budget
from ster.engine.protocol.errors import Refusal
from ster.engine.model.decoding import Sampling, StopReason, decode
from ster.engine.steering.extract import PromptSet
from ster.engine.protocol.files import first_error, load_document
from ster.engine.steering.generate import scales_for
from ster.engine.steering.strength import Unit
from ster.engine.protocol.jobs import JobContext
from ster.engine.model.llama import Decoder
from ster.engine.steering.requests import SweepRequest
from ster.engine.steering.apply import plan, steer
from ster.engine.steering.vectors import open_artifact
from ster.engine.model.loading import model_store

DISTINCT_RATIO = 0.75
RUN_SLACK = 2
LENGTH_RATIO = 0.5


class SweepOutput(BaseModel):
    prompt: str
    text: str
    tokens: int
    stop_reason: StopReason


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
    """``projection`` minus the baseline's."""
    distinct_2: float | None
    longest_run: int
    mean_tokens: float
    fluent: bool
    outputs: list[SweepOutput]


class Suggested(BaseModel):
    """Per sign, the largest fluent strength, in the sweep's ``strength_unit``."""

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
    trait_name: str
    layers: list[int]
    strength_unit: Unit
    chat_template: str
    precision: str
    max_new_tokens: int
    temperature: float
    seed: int
    bound: DegeneracyBound
    rows: list[SweepRow]
    suggested: Suggested


def distinct_2(ids: list[int]) -> float | None:
    bigrams = list(zip(ids, ids[1:]))
    return len(set(bigrams)) / len(bigrams) if bigrams else None


def longest_run(ids: list[int]) -> int:
    best = run = 0
    for i, token in enumerate(ids):
        run = run + 1 if i and token == ids[i - 1] else 1
        best = max(best, run)
    return best


def text_projections(model: Decoder, texts: list[list[int]], directions: dict[int, torch.Tensor]) -> list[float]:
    """Each encoded text's last-token state, read without steering exactly as a pair side is read when a
    direction is fitted, projected onto the direction; mean over the artifact's layers."""
    layers = sorted(directions)
    states = read_last_states(model, texts, layers, batch_size=8).double()  # [N, L, D]
    stacked = torch.stack([directions[layer].cpu() for layer in layers])  # [L, D]
    return (states * stacked).sum(-1).mean(-1).tolist()


def _prompts(request: SweepRequest) -> list[str]:
    if request.prompt_texts is not None:
        try:
            return PromptSet(prompts=request.prompt_texts).prompts
        except ValidationError as exc:
            raise Refusal(f"the sweep's prompts are not usable: {first_error(exc)}") from None
    if request.prompts is None:
        raise Refusal("sweep needs prompts: give --prompts FILE")
    return load_document(request.prompts, PromptSet, "prompts").prompts


def sweep_job(request: SweepRequest, ctx: JobContext) -> SweepResult:
    prompts = _prompts(request)
    checkpoint = model_store(ctx).open(request, ctx)
    artifact = open_artifact(ctx, request.vector, checkpoint)
    codec = checkpoint.codec
    encoded = encode_each(codec, prompts, checkpoint.context, "sweep prompt")
    request = request.model_copy(update={"max_new_tokens": generation_budget(
        max(map(len, encoded)), request.max_new_tokens, request.default_max_new_tokens, checkpoint.context, ctx.log)})
    model = model_store(ctx).decoder(checkpoint, ctx)
    directions = {layer: torch.tensor(v, dtype=torch.float64, device=model.lm_head.weight.device)
                  for layer, v in artifact.by_layer().items()}
    rows = [_sweep_strength(ctx, model, checkpoint.codec, artifact, request, prompts, encoded, directions, step)
            for step in range(len(request.strengths))]
    rows = _judge(rows)
    return SweepResult(model=checkpoint.source.model, model_revision=checkpoint.source.revision,
                       vector=str(request.vector), trait_name=artifact.trait_name, layers=sorted(directions),
                       strength_unit=request.strengths[0].unit,
                       chat_template=codec.decision, precision=request.precision,
                       max_new_tokens=request.max_new_tokens, temperature=request.temperature, seed=request.seed,
                       bound=DegeneracyBound(), rows=rows, suggested=_suggest(rows))


def _sweep_strength(ctx: JobContext, model: Decoder, codec: TextCodec, artifact: SteeringArtifact,
                    request: SweepRequest, prompts: list[str], encoded: list[list[int]],
                    directions: dict[int, torch.Tensor], step: int) -> SweepRow:
    """Generate every prompt at one strength, then re-read the texts unsteered and measure them."""
    strength = request.strengths[step]
    scales = scales_for(artifact, strength)
    outputs, generated = [], []
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        ctx.progress("sweep", f"strength {strength.signed()}: prompt {index + 1}/{len(prompts)}",
                     step * len(prompts) + index + 1, len(request.strengths) * len(prompts))
        stream, label = codec.stream(), f"{strength.signed()}/{index}"

        def on_token(i: int, token: int) -> None:
            delta = stream.step(codec.tokenizer, token)
            if delta:
                ctx.token(delta, i, stream=label)

        steering = steer(model, plan(model, artifact.by_layer(), scales.absolute)) if strength.value else nullcontext()
        with steering:
            generation = decode(model, ids, max_new_tokens=request.max_new_tokens,
                                sampling=Sampling(request.temperature, request.top_p, request.seed),
                                eos_ids=codec.eos_ids, on_token=on_token, check_cancelled=ctx.check_cancelled)
        outputs.append(SweepOutput(prompt=prompt, text=codec.decode(generation.ids), tokens=len(generation.ids),
                                   stop_reason=generation.stop_reason))
        generated.append(generation.ids)
    texts = [codec.encode_prompt(o.text) for o in outputs if o.text.strip()]
    projections = text_projections(model, texts, directions) if texts else []
    distincts = [d for d in map(distinct_2, generated) if d is not None]
    return SweepRow(strength=strength.value, absolute_strength=scales.labelled(scales.absolute),
                    relative_strength=scales.labelled(scales.relative),
                    projection=sum(projections) / len(projections) if projections else None, effect=None,
                    distinct_2=sum(distincts) / len(distincts) if distincts else None,
                    longest_run=max(map(longest_run, generated)),
                    mean_tokens=sum(map(len, generated)) / len(generated), fluent=True, outputs=outputs)


def _judge(rows: list[SweepRow]) -> list[SweepRow]:
    """Fill in each row's effect against the baseline, and whether it stays within the degeneracy bound."""
    base = next(row for row in rows if row.strength == 0)
    judged = []
    for row in rows:
        effect = None if row.projection is None or base.projection is None else row.projection - base.projection
        fluent = (row.longest_run <= base.longest_run + RUN_SLACK
                  and row.mean_tokens >= LENGTH_RATIO * base.mean_tokens
                  and (base.distinct_2 is None or (row.distinct_2 or 0.0) >= DISTINCT_RATIO * base.distinct_2))
        judged.append(row.model_copy(update={"effect": effect, "fluent": fluent}))
    return judged


def _suggest(rows: list[SweepRow]) -> Suggested:
    def walk(candidates: list[SweepRow]) -> float | None:
        chosen = None
        for row in candidates:
            if not row.fluent:
                break
            chosen = row.strength
        return chosen

    positive = sorted((r for r in rows if r.strength > 0), key=lambda r: r.strength)
    negative = sorted((r for r in rows if r.strength < 0), key=lambda r: -r.strength)
    return Suggested(positive=walk(positive), negative=walk(negative))
