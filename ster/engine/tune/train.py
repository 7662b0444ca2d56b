"""The training jobs: ``tune sft``, ``tune dpo``, ``tune reward`` and ``tune grpo``.

Each job checks everything it can before a weight is mapped (flags in the request,
the data, the encoded lengths against the sequence limit, the output paths, and with
``--resume`` that the checkpoint belongs to this run), then draws a fresh adapter (or
restores the checkpoint's), attaches it to the shared decoder for the length of the
run, trains it through :class:`~ster.engine.tune.loop.Loop`, and writes the adapter and
its sidecar once, atomically, together. Only the adapter's tensors (and a reward run's
head) train; the base stays frozen and is never copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from ster.engine.model.adapters.apply import CheckedAdapter, check_adapter
from ster.engine.model.adapters.artifact import projection_shape, sidecar_path
from ster.engine.model.config import DecoderConfig
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import check_output_file, load_document
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.kinds import ADAPTER, ADAPTER_SIDECAR
from ster.engine.protocol.naming import flag
from ster.engine.steering.extract import PromptSet
from ster.engine.steering.layers import LayerSpec
from ster.engine.tune.checkpoint import check_checkpoint, check_slot, checkpoint_path, run_identity
from ster.engine.tune.data import PreferenceSet, load_examples, load_preferences
from ster.engine.tune.encoding import encode_example, side_sequence, within_limit
from ster.engine.tune.requests import (
    AdapterSpecRequest,
    DpoRequest,
    GrpoRequest,
    RewardRequest,
    SftRequest,
    TuneRequest,
)


class TrainResult(BaseModel):
    """What every training objective prints: where the adapter is, and the run's report."""

    path: str
    report: dict[str, Any]


def sft_job(request: SftRequest, ctx: JobContext) -> TrainResult:
    examples = load_examples(request.examples)
    checkpoint = model_store(ctx).open(request, ctx)
    rows = [encode_example(checkpoint.codec, example) for example in examples.examples]
    units = [((seq.ids,), (seq.boundary,)) for seq in rows]
    return _train(request, ctx, checkpoint, units, lambda adapter: _objective(request, adapter))


def dpo_job(request: DpoRequest, ctx: JobContext) -> TrainResult:
    preferences = load_preferences(request.pairs)
    checkpoint = model_store(ctx).open(request, ctx)
    return _train(
        request, ctx, checkpoint, pair_units(preferences, checkpoint), lambda adapter: _objective(request, adapter)
    )


def reward_job(request: RewardRequest, ctx: JobContext) -> TrainResult:
    preferences = load_preferences(request.pairs)
    checkpoint = model_store(ctx).open(request, ctx)
    return _train(
        request,
        ctx,
        checkpoint,
        pair_units(preferences, checkpoint),
        lambda adapter: _objective(request, adapter),
        reward=True,
    )


def grpo_job(request: GrpoRequest, ctx: JobContext) -> TrainResult:
    prompts = load_document(request.prompts, PromptSet, "prompts").prompts
    checkpoint = model_store(ctx).open(request, ctx)
    reward = _reward_source(request, ctx, checkpoint)  # before the policy loads
    units = [((checkpoint.codec.encode_prompt(prompt),), (0,)) for prompt in prompts]

    def objective(adapter: Any) -> Any:
        from ster.engine.tune.grpo import Grpo, RewardModel

        reward_model = None
        if reward is not None:
            from ster.engine.model.adapters.apply import load_checked

            _, frozen = load_checked(ctx, reward, checkpoint, adapter.tensors[next(iter(adapter.tensors))].device)
            reward_model = RewardModel(frozen)
        return Grpo(
            group=request.group,
            beta=request.beta,
            max_new_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            eos_ids=checkpoint.codec.eos_ids,
            prompts=len(units),
            iterations=request.iterations,
            reward_model=reward_model,
        )

    return _train(request, ctx, checkpoint, units, objective)


def _reward_source(request: GrpoRequest, ctx: JobContext, checkpoint: Checkpoint) -> CheckedAdapter | None:
    """None for the length reward; otherwise the reward model, checked as one (kind, model, shapes)."""
    path = request.reward_path
    if path is None:
        return None
    if not confine.readable(path).exists():
        raise Refusal(f'reward source "{request.reward}" is neither the keyword length nor a file that exists')
    return check_adapter(ctx, path, checkpoint, want="reward")


def pair_units(
    preferences: PreferenceSet, checkpoint: Checkpoint
) -> list[tuple[tuple[list[int], ...], tuple[int, ...]]]:
    """Each pair's chosen and rejected ids, and where each side's scored tokens start (after a prompt)."""
    units: list[tuple[tuple[list[int], ...], tuple[int, ...]]] = []
    for number, pair in enumerate(preferences.pairs, start=1):
        sides = []
        for which, text in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            sequence = side_sequence(checkpoint.codec, text, pair.prompt)
            if len(sequence.ids) - sequence.boundary < 1 or len(sequence.ids) < 2:
                raise Refusal(f"pair {number} {which} side encodes to one token, so there is nothing to predict")
            sides.append(sequence)
        units.append(((sides[0].ids, sides[1].ids), (sides[0].boundary, sides[1].boundary)))
    return units


def _objective(request: TuneRequest, adapter: Any) -> Any:
    from ster.engine.tune.objectives import Preference, Reward, Sft

    if isinstance(request, DpoRequest):
        return Preference(beta=request.beta, loss=request.loss)
    if isinstance(request, RewardRequest):
        return Reward(adapter.head)
    return Sft()


def _usable(request: TuneRequest, checkpoint: Checkpoint, units: list[Any], ctx: JobContext) -> list[int]:
    """Indices of the units within the sequence limit, counting a GRPO prompt's new tokens too."""
    new = request.max_new_tokens if isinstance(request, GrpoRequest) else 0
    return within_limit(
        [max(len(row) for row in rows) for rows, _ in units],
        min(request.max_sequence, checkpoint.context),
        request.unit,
        "train on",
        ctx,
        new,
    )


def _check_outputs(request: TuneRequest, ctx: JobContext) -> None:
    """The adapter replaces only an older adapter (a safetensors file with its sidecar), and its sidecar only an
    older sidecar: a model's weights, an artifact, a pair set or a file of the user's is never replaced."""
    check_output_file(request.output, ADAPTER, ctx.log, what=flag("output"))
    check_output_file(sidecar_path(request.output), ADAPTER_SIDECAR, ctx.log, what="the adapter's sidecar")


def check_rank(request: AdapterSpecRequest, config: DecoderConfig) -> None:
    """Refuse a rank above the smaller side of a targeted projection, read from config.json before any weight:
    such a factor pair spans nothing a full update would not, and only costs memory (10^5 on a 64-wide model is a
    358 MB adapter)."""
    for target in request.target_names:
        rows, columns = projection_shape(config, target)
        if request.rank > min(rows, columns):
            raise Refusal(
                f"adapter rank {request.rank} is above {min(rows, columns)}, the smaller side of the "
                f"{target} projection ({rows}x{columns}) of this model; choose a rank of at most "
                f"{min(rows, columns)}"
            )


def _train(
    request: TuneRequest,
    ctx: JobContext,
    checkpoint: Checkpoint,
    units: list[Any],
    make_objective: Callable[[Any], Any],
    reward: bool = False,
) -> TrainResult:
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    check_rank(request, checkpoint.config)
    usable = _usable(request, checkpoint, units, ctx)
    _check_outputs(request, ctx)
    if request.resume:
        check_checkpoint(
            checkpoint_path(request.output), run_identity(request, checkpoint.fingerprint, [units[i] for i in usable])
        )
    else:
        check_slot(checkpoint_path(request.output))  # the run may write a checkpoint there, and removes it at the end
    from ster.engine.tune.session import (
        run_training,  # torch, once every input has been checked
    )

    report, _adapter = run_training(request, ctx, checkpoint, units, usable, layers, make_objective, reward)
    return TrainResult(path=str(request.output), report=report)
