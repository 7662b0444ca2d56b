"""One training run on a mapped decoder: adapter, objective, loop, checkpoints, report, the written pair.

Under ``torchrun`` this is one rank's part: it joins the process group before the
weights load and leaves it at the end, and only rank 0 writes checkpoints and the pair.

The part of the training jobs that needs torch; :mod:`ster.engine.tune.train` imports it
only once every input has been checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ster.engine.model.adapters.artifact import AdapterSidecar
from ster.engine.model.adapters.lora import Adapter, attached, save_adapter
from ster.engine.model.loading import Checkpoint, model_store, resolve_device
from ster.engine.protocol import confine
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.checkpoint import (
    checkpoint_path,
    load_checkpoint,
    remove_checkpoint,
    run_identity,
    save_checkpoint,
)
from ster.engine.tune.checkpoint_values import Expected
from ster.engine.tune.loop import Loop, Settings
from ster.engine.tune.objectives import Unit
from ster.engine.tune.parallel import Parallel
from ster.engine.tune.requests import DpoRequest, GrpoRequest, TuneRequest


def run_training(
    request: TuneRequest,
    ctx: JobContext,
    checkpoint: Checkpoint,
    units: list[Any],
    usable: list[int],
    layers: list[int],
    make_objective: Callable[[Adapter], Any],
    reward: bool,
) -> tuple[dict[str, Any], Adapter]:
    """Train, report and (on rank 0) write; under ``torchrun`` inside the process group, left at the end."""
    parallel = Parallel.from_environment(resolve_device(request.device))
    try:
        return _run(request, ctx, checkpoint, units, usable, layers, make_objective, reward, parallel)
    finally:
        parallel.close()


def _run(
    request: TuneRequest,
    ctx: JobContext,
    checkpoint: Checkpoint,
    units: list[Any],
    usable: list[int],
    layers: list[int],
    make_objective: Callable[[Adapter], Any],
    reward: bool,
    parallel: Parallel,
) -> tuple[dict[str, Any], Adapter]:
    if parallel.world > 1:
        ctx.log(f"data parallel over {parallel.world} processes; this one, rank 0, reports and writes")
    decoder = model_store(ctx).decoder(checkpoint, ctx)
    adapter = Adapter.fresh(
        checkpoint.config,
        request.rank,
        request.alpha,
        request.target_names,
        layers,
        request.seed,
        decoder.lm_head.weight.device,
        reward=reward,
    )
    params = adapter.trainable()
    noun = "tensors" if reward else "adapter tensors"
    ctx.progress(
        "train",
        f"training {len(params)} {noun} ({adapter.parameter_count()} parameters) at rank "
        f"{request.rank} across {len(layers)} layers",
    )
    trained = [Unit(i, *units[i]) for i in usable]
    objective = make_objective(adapter)
    settings = Settings(
        request.passes,
        request.batch_size,
        request.accumulation,
        request.learning_rate,
        request.warmup_steps,
        request.seed,
        request.checkpoint_every,
    )
    loop = Loop(decoder, params, objective, trained, settings, ctx, parallel)
    identity = run_identity(request, checkpoint.fingerprint, [units[i] for i in usable])
    where = checkpoint_path(request.output)
    if request.resume:
        saved = load_checkpoint(where, identity, _expected(adapter, loop, objective), loop.optimizer.state_dict())
        _restore(saved, adapter, loop, objective, ctx)
    elif confine.writable(where, make=False).exists() and parallel.writer:
        ctx.log(
            f"starting over; the checkpoint of an earlier run at {where} will be replaced",
            {"checkpoint": "replaced", "path": str(where)},
        )

    def save(current: Loop) -> str:
        if parallel.writer:
            save_checkpoint(
                where,
                identity,
                adapter.state(),
                current.optimizer.state_dict(),
                current.state.to_dict(),
                getattr(objective, "reference", {}),
            )
        return str(where)

    with attached(decoder, adapter):
        objective.prepare(decoder, loop.first_epoch(), ctx, parallel)
        state = loop.run(save)
    report = _report(request, checkpoint, units, trained, loop, objective, adapter, layers)
    if parallel.writer:
        save_adapter(
            request.output, sidecar_for(request, checkpoint, layers, report, reward), adapter, checkpoint.config
        )
        remove_checkpoint(where)
    ctx.log(
        f"trained {state.step} steps, {state.tokens} tokens in {state.seconds:.1f} s "
        f"({state.tokens / max(state.seconds, 1e-9):.1f} tokens/s)"
    )
    return report, adapter


def _expected(adapter: Adapter, loop: Loop, objective: Any) -> Expected:
    """What a checkpoint must hold to resume this run: its adapter's tensors, its loop's steps and units, the
    per-unit numbers its objective reads, and (dpo, ipo) a reference score for every unit it trains on."""

    def read_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
        objective.step_tokens([], stats)
        entry, _ = objective.epoch_report(0, 1, stats)
        return entry

    reference = {unit.index for unit in loop.units} if hasattr(objective, "reference") else None
    return Expected(
        {name: tuple(t.shape) for name, t in adapter.tensors.items()},
        loop.total,
        loop.steps_per_epoch,
        loop.per_step,
        len(loop.units),
        reference,
        read_stats,
    )


def _restore(saved: dict[str, Any], adapter: Adapter, loop: Loop, objective: Any, ctx: JobContext) -> None:
    with torch.no_grad():
        for name, tensor in adapter.tensors.items():
            tensor.copy_(saved["tensors"][name])
    loop.restore(saved["loop"], saved["optimizer"])
    if hasattr(objective, "reference"):
        objective.reference = saved["reference"]
    ctx.log(
        f"resuming after step {loop.state.step} of {loop.total}",
        {"checkpoint": "resumed", "step": loop.state.step, "total": loop.total},
    )


def _report(
    request: TuneRequest,
    checkpoint: Checkpoint,
    units: list[Any],
    trained: list[Unit],
    loop: Loop,
    objective: Any,
    adapter: Adapter,
    layers: list[int],
) -> dict[str, Any]:
    state, unit = loop.state, request.unit
    stats = state.epoch_stats
    if isinstance(request, GrpoRequest):
        return _grpo_report(request, checkpoint, units, trained, loop, objective, adapter, layers)
    report: dict[str, Any] = {}
    if isinstance(request, DpoRequest):
        report.update(loss=request.loss, beta=request.beta)
    report.update(
        {
            f"{unit}s": len(units),
            f"trained_{unit}s": len(trained),
            "skipped_long": len(units) - len(trained),
            "epochs": request.epochs,
            "steps": loop.total,
            "trainable_tensors": len(adapter.tensors),
            "trainable_parameters": adapter.parameter_count(),
            "first_loss": state.first_loss,
            "final_loss": state.final_loss,
            "mean_final_epoch_loss": math.fsum(s["loss"] for s in stats) / len(stats),
        }
    )
    report.update(objective.report(stats).summary)
    report.update(
        rank=request.rank,
        alpha=float(request.alpha),
        targets=request.target_names,
        layers=layers,
        learning_rate=request.learning_rate,
        accumulation=request.accumulation,
        batch=request.batch_size,
        chat_template=checkpoint.codec.decision,
        precision=request.precision,
        seed=request.seed,
        warmup_steps=request.warmup_steps,
        max_sequence=min(request.max_sequence, checkpoint.context),
        tokens=state.tokens,
        history=state.epoch_history,
    )
    return report


def _grpo_report(
    request: GrpoRequest,
    checkpoint: Checkpoint,
    units: list[Any],
    trained: list[Unit],
    loop: Loop,
    objective: Any,
    adapter: Adapter,
    layers: list[int],
) -> dict[str, Any]:
    """The contract's GRPO report; the top-level mean_* fields are the last iteration's."""
    state = loop.state
    last = objective.report(state.epoch_stats).summary
    return {
        "reward": "length" if request.reward_path is None else f"reward:{request.reward_path}",
        "prompts": len(units),
        "trained_prompts": len(trained),
        "skipped_long": len(units) - len(trained),
        "group": request.group,
        "iterations": request.iterations,
        "steps": loop.total,
        "beta": request.beta,
        "trainable_tensors": len(adapter.tensors),
        "trainable_parameters": adapter.parameter_count(),
        "first_loss": state.first_loss,
        "final_loss": state.final_loss,
        "mean_reward": last["mean_reward"],
        "mean_kl": last["mean_kl"],
        "policy_loss": last["policy_loss"],
        "max_new_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "rank": request.rank,
        "alpha": float(request.alpha),
        "targets": request.target_names,
        "layers": layers,
        "learning_rate": request.learning_rate,
        "accumulation": request.accumulation,
        "warmup_steps": request.warmup_steps,
        "max_sequence": min(request.max_sequence, checkpoint.context),
        "chat_template": checkpoint.codec.decision,
        "precision": request.precision,
        "tokens": state.tokens,
        "history": state.epoch_history,
    }


def sidecar_for(
    request: TuneRequest, checkpoint: Checkpoint, layers: list[int], report: dict[str, Any], reward: bool
) -> AdapterSidecar:
    return AdapterSidecar(
        kind="reward" if reward else "adapter",
        model=checkpoint.source.model,
        model_revision=checkpoint.source.revision,
        model_fingerprint=checkpoint.fingerprint,
        rank=request.rank,
        alpha=float(request.alpha),
        targets=request.target_names,
        layers=layers,
        hidden_size=checkpoint.config.hidden_size,
        train=report,
    )
