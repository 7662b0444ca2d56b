"""The ``tune evaluate`` job: how well a checkpoint, or an adapter on it, fits held-out data. Writes nothing.

On examples (the original's command): each example is encoded exactly as ``tune sft``
encodes it, and its completion tokens are scored (the prompt never is). The report gives,
per example and in aggregate, the negative log-likelihood per completion token and its
perplexity: ``loss`` is the total NLL over the total completion tokens, summed in input
order in f64; ``mean_example_loss`` is the unweighted mean of the examples' own losses.

On preference pairs (beyond the original): a generation adapter is scored by DPO's
implicit reward, beta times the log-probability ratio of the adapted model to the bare
checkpoint (the same decoder with adapters off, as in training), and a reward model by
its head's scores; accuracy is the share of pairs whose chosen side scores strictly higher.
The numbers are the training objective's own (:mod:`ster.engine.tune.objectives`), so they
read like a training report's final-epoch figures, on data the run did not see.

A sequence longer than ``--max-sequence`` (capped at the model's context) is skipped with a
progress line, never cut. Every input is checked before torch is imported.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel

from ster.engine.model.adapters.apply import adapted, check_adapter, load_checked
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.data import Message, load_examples, load_preferences
from ster.engine.tune.encoding import encode_example, encode_side, within_limit
from ster.engine.tune.requests import TuneEvaluateRequest


class ExampleEntry(BaseModel):
    index: int
    """The example's position in the set, 0-based."""
    prompt: str | list[Message]
    completion: str
    completion_tokens: int
    loss: float
    """Mean negative log-likelihood of this example's completion tokens, in nats."""
    perplexity: float


class EvaluateReport(BaseModel):
    """What ``tune evaluate --examples`` prints."""

    model: str
    model_revision: str | None
    adapter: str | None
    name: str | None
    examples: int
    evaluated: int
    skipped_long: int
    completion_tokens: int
    loss: float
    """Total negative log-likelihood over total completion tokens (f64)."""
    perplexity: float
    mean_example_loss: float
    """Unweighted mean of the examples' own losses."""
    mean_example_perplexity: float
    chat_template: str
    precision: str
    entries: list[ExampleEntry]


class PairEntry(BaseModel):
    index: int
    """The pair's position in the set, 0-based."""
    chosen: float
    """The chosen side's implicit reward (a generation adapter) or score (a reward model)."""
    rejected: float
    margin: float
    correct: bool
    """Whether the chosen side scored strictly higher."""


class PairEvaluateReport(BaseModel):
    """What ``tune evaluate --pairs`` prints."""

    model: str
    model_revision: str | None
    adapter: str
    measure: Literal["implicit_reward", "reward_model"]
    """``implicit_reward``: beta times the adapted model's log-ratio to the bare checkpoint (a generation adapter);
    ``reward_model``: the reward head's score (a reward artifact)."""
    loss: str | None
    """The preference loss the implicit reward follows: ``ipo`` divides each log-ratio by its token count, as
    an IPO adapter was trained; null for a reward model."""
    beta: float | None
    name: str | None
    pairs: int
    evaluated: int
    skipped_long: int
    accuracy: float
    tied_pairs: int
    mean_chosen: float
    mean_rejected: float
    mean_margin: float
    mean_loss: float
    """The objective's own mean loss on these pairs: DPO's (or IPO's), or Bradley–Terry's."""
    chat_template: str
    precision: str
    entries: list[PairEntry]


def evaluate_job(request: TuneEvaluateRequest, ctx: JobContext) -> EvaluateReport | PairEvaluateReport:
    checkpoint = model_store(ctx).open(request, ctx)
    if request.pairs is not None:
        return _evaluate_pairs(request, ctx, checkpoint)
    assert request.examples is not None
    examples = load_examples(request.examples)
    sequences = [encode_example(checkpoint.codec, example) for example in examples.examples]
    usable = within_limit(
        [len(seq.ids) for seq in sequences], _limit(request, checkpoint), request.unit, "evaluate", ctx
    )
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    # torch, once every input has been checked
    from ster.engine.tune.scoring import completion_nlls

    decoder = model_store(ctx).decoder(checkpoint, ctx)
    total = len(sequences)

    def on_example(position: int, nll: float, tokens: int) -> None:
        index = usable[position]
        loss = nll / tokens
        ctx.progress(
            "evaluate",
            f"example {index + 1}/{total} loss {loss:.4f} perplexity {_exp(loss):.4f}",
            index + 1,
            total,
            data={"loss": loss, "perplexity": _exp(loss), "tokens": tokens},
        )

    with adapted(ctx, decoder, adapter, checkpoint):
        scored = completion_nlls(
            decoder, [sequences[i] for i in usable], request.batch_size, ctx.check_cancelled, on_example
        )
    entries = [
        ExampleEntry(
            index=i,
            prompt=examples.examples[i].prompt,
            completion=examples.examples[i].completion,
            completion_tokens=tokens,
            loss=nll / tokens,
            perplexity=_exp(nll / tokens),
        )
        for i, (nll, tokens) in zip(usable, scored)
    ]
    tokens = sum(entry.completion_tokens for entry in entries)
    loss = sum(nll for nll, _ in scored) / tokens
    mean_example_loss = sum(entry.loss for entry in entries) / len(entries)
    ctx.progress(
        "evaluate", f"{len(entries)} examples, {tokens} completion tokens, loss {loss:.4f}, perplexity {_exp(loss):.4f}"
    )
    return EvaluateReport(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        adapter=str(request.adapter) if adapter else None,
        name=examples.name,
        examples=total,
        evaluated=len(entries),
        skipped_long=total - len(entries),
        completion_tokens=tokens,
        loss=loss,
        perplexity=_exp(loss),
        mean_example_loss=mean_example_loss,
        mean_example_perplexity=_exp(mean_example_loss),
        chat_template=checkpoint.codec.decision,
        precision=request.precision,
        entries=entries,
    )


def _exp(loss: float) -> float:
    """exp of a loss in nats; the largest finite float rather than an overflow for an absurd one."""
    return math.exp(loss) if loss < 709.0 else 1.7976931348623157e308


def _limit(request: TuneEvaluateRequest, checkpoint: Checkpoint) -> int:
    return min(request.max_sequence, checkpoint.context)


def _pair_rows(checkpoint: Checkpoint, chosen: str, rejected: str, prompt: Any, number: int) -> tuple[list[int], ...]:
    """Both sides' ids, encoded as preference training encodes them (an assistant turn under a template)."""
    sides = []
    for which, text in (("chosen", chosen), ("rejected", rejected)):
        ids = encode_side(checkpoint.codec, text, prompt)
        if len(ids) < 2:
            raise Refusal(f"pair {number} {which} side encodes to one token, so there is nothing to predict")
        sides.append(ids)
    return tuple(sides)


def _evaluate_pairs(request: TuneEvaluateRequest, ctx: JobContext, checkpoint: Checkpoint) -> PairEvaluateReport:
    preferences = load_preferences(request.pairs)
    rows = [
        _pair_rows(checkpoint, p.chosen, p.rejected, p.prompt, number)
        for number, p in enumerate(preferences.pairs, start=1)
    ]
    usable = within_limit(
        [max(map(len, sides)) for sides in rows], _limit(request, checkpoint), request.unit, "evaluate", ctx
    )
    checked = check_adapter(ctx, request.adapter, checkpoint, want=None)
    assert checked is not None
    # torch, once every input has been checked
    from ster.engine.model.adapters.lora import attached
    from ster.engine.tune import scoring
    from ster.engine.tune.objectives import Unit

    decoder = model_store(ctx).decoder(checkpoint, ctx)
    sidecar, adapter = load_checked(ctx, checked, checkpoint, decoder.lm_head.weight.device)
    reward = checked.want == "reward"
    loss = None if reward else _preference_loss(sidecar.train)
    objective = scoring.reward_model(adapter.head) if reward else scoring.implicit_reward(request.beta, loss or "dpo")
    units = [Unit(i, rows[i], (1, 1)) for i in usable]
    chosen_key, rejected_key = ("chosen_score", "rejected_score") if reward else ("chosen_reward", "rejected_reward")
    word = "score" if reward else "reward"

    def on_pair(position: int, numbers: dict[str, float]) -> None:
        index = units[position].index
        ctx.progress(
            "evaluate",
            f"pair {index + 1}/{len(rows)} chosen {word} {numbers[chosen_key]:.4f} rejected "
            f"{word} {numbers[rejected_key]:.4f}",
            index + 1,
            len(rows),
            data={"chosen": numbers[chosen_key], "rejected": numbers[rejected_key]},
        )

    with attached(decoder, adapter):
        stats = scoring.pair_stats(objective, decoder, units, request.batch_size, ctx, on_pair)
    entries = [
        PairEntry(
            index=unit.index,
            chosen=s[chosen_key],
            rejected=s[rejected_key],
            margin=s[chosen_key] - s[rejected_key],
            correct=bool(s["correct"]),
        )
        for unit, s in zip(units, stats)
    ]
    count = len(entries)
    accuracy = sum(entry.correct for entry in entries) / count
    mean_chosen, mean_rejected = sum(e.chosen for e in entries) / count, sum(e.rejected for e in entries) / count
    ctx.progress(
        "evaluate", f"{count} pairs, accuracy {accuracy:.3f}, mean {word} margin {mean_chosen - mean_rejected:.4f}"
    )
    return PairEvaluateReport(
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        adapter=str(request.adapter),
        measure="reward_model" if reward else "implicit_reward",
        loss=loss,
        beta=None if reward else request.beta,
        name=preferences.name,
        pairs=len(rows),
        evaluated=count,
        skipped_long=len(rows) - count,
        accuracy=accuracy,
        tied_pairs=sum(e.chosen == e.rejected for e in entries),
        mean_chosen=mean_chosen,
        mean_rejected=mean_rejected,
        mean_margin=mean_chosen - mean_rejected,
        mean_loss=sum(s["loss"] for s in stats) / count,
        chat_template=checkpoint.codec.decision,
        precision=request.precision,
        entries=entries,
    )


def _preference_loss(train: dict[str, Any] | None) -> str:
    """``ipo`` for an adapter trained with IPO (whose log-ratios are per token), else ``dpo``."""
    return "ipo" if (train or {}).get("loss") == "ipo" else "dpo"
