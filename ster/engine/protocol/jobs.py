"""The job protocol: every operation is a function ``(request, ctx) -> result document``.

A job emits progress, token, warning and log events through its context while it
runs and never prints. :func:`run_job` adds the one final event — the result, or an
error for a refusal, a cancellation or a bug — so every consumer (the CLI, ``ster
--json``, the TUI) sees the same stream and the same ending. Jobs are registered by
import path, so choosing a job imports nothing heavy until it runs.
"""

from __future__ import annotations

import importlib
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import Cancelled, SterError
from ster.engine.protocol.events import Error, Event, Log, Outcome, Progress, Result, Token, Warning
from ster.engine.protocol.requests import build_request, check_before_running

JOBS: dict[str, tuple[str, str]] = {
    "generate": ("ster.engine.steering.generate:generate_job", "ster.engine.steering.requests:GenerateRequest"),
    "extract": ("ster.engine.steering.extract:extract_job", "ster.engine.steering.requests:ExtractRequest"),
    "train": ("ster.engine.steering.direction_jobs:train_job", "ster.engine.steering.requests:TrainRequest"),
    "optimize": ("ster.engine.steering.direction_jobs:optimize_job", "ster.engine.steering.requests:OptimizeRequest"),
    "evaluate": ("ster.engine.steering.direction_jobs:evaluate_job", "ster.engine.steering.requests:EvaluateRequest"),
    "inspect": ("ster.engine.steering.artifact:inspect_job", "ster.engine.steering.requests:InspectRequest"),
    "sweep": ("ster.engine.steering.sweep:sweep_job", "ster.engine.steering.requests:SweepRequest"),
    "calibrate": ("ster.engine.steering.calibrate:calibrate_job", "ster.engine.steering.requests:CalibrateRequest"),
    "bake": ("ster.engine.steering.bake:bake_job", "ster.engine.steering.requests:BakeRequest"),
    "vector import": (
        "ster.engine.steering.vector_import:import_job",
        "ster.engine.steering.requests:VectorImportRequest",
    ),
    "pairs inspect": ("ster.engine.pairs.inspect:inspect_job", "ster.engine.pairs.requests:PairsInspectRequest"),
    "pairs add": ("ster.engine.pairs.edit:add_job", "ster.engine.pairs.requests:PairsAddRequest"),
    "pairs remove": ("ster.engine.pairs.edit:remove_job", "ster.engine.pairs.requests:PairsRemoveRequest"),
    "pairs save": ("ster.engine.pairs.edit:save_job", "ster.engine.pairs.requests:PairsSaveRequest"),
    "pairs synthesize": (
        "ster.engine.pairs.synthesize:synthesize_job",
        "ster.engine.pairs.requests:PairsSynthesizeRequest",
    ),
    "workspace import-pairs": (
        "ster.engine.pairs.workspace:import_job",
        "ster.engine.pairs.requests:WorkspaceImportRequest",
    ),
    "workspace show": ("ster.engine.pairs.workspace:show_job", "ster.engine.pairs.requests:WorkspaceShowRequest"),
    "workspace select": ("ster.engine.pairs.workspace:select_job", "ster.engine.pairs.requests:WorkspaceSelectRequest"),
    "workspace remove": ("ster.engine.pairs.workspace:remove_job", "ster.engine.pairs.requests:WorkspaceRemoveRequest"),
    "onboarding": ("ster.engine.pairs.onboarding:onboarding_job", "ster.engine.pairs.requests:OnboardingRequest"),
    "model import": ("ster.engine.model.gguf_import:import_job", "ster.engine.model.requests:ModelImportRequest"),
    "tune sft": ("ster.engine.tune.train:sft_job", "ster.engine.tune.requests:SftRequest"),
    "tune dpo": ("ster.engine.tune.train:dpo_job", "ster.engine.tune.requests:DpoRequest"),
    "tune reward": ("ster.engine.tune.train:reward_job", "ster.engine.tune.requests:RewardRequest"),
    "tune grpo": ("ster.engine.tune.train:grpo_job", "ster.engine.tune.requests:GrpoRequest"),
    "tune evaluate": ("ster.engine.tune.evaluate:evaluate_job", "ster.engine.tune.requests:TuneEvaluateRequest"),
    "tune merge": ("ster.engine.tune.merge:merge_job", "ster.engine.tune.requests:MergeRequest"),
    "tune inspect": ("ster.engine.tune.inspect:inspect_job", "ster.engine.tune.requests:TuneInspectRequest"),
    "tune export-peft": ("ster.engine.tune.peft_interop:export_job", "ster.engine.tune.requests:ExportPeftRequest"),
}
"""Job name → (``module:function`` of the job, ``module:class`` of its request). The name is the
command path a user types; every parsed flag becomes a request field of the same name."""

Sink = Callable[[Event], None]


@dataclass
class JobContext:
    """What a running job may touch: the event sink, the cancel flag, and the model store."""

    emit: Sink
    cancel: threading.Event = field(default_factory=threading.Event)
    models: Any = None
    """The front end's model store, shared between its jobs; a job that maps a checkpoint creates one
    when the front end gave none (see :func:`ster.engine.model.loading.model_store`)."""

    def progress(
        self,
        stage: str,
        message: str,
        current: int | None = None,
        total: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.emit(Progress(stage=stage, message=message, current=current, total=total, data=data))

    def token(self, text: str, index: int, stream: str = "text") -> None:
        self.emit(Token(text=text, index=index, stream=stream))

    def log(self, message: str, data: dict[str, Any] | None = None) -> None:
        self.emit(Log(message=message, data=data))

    def warn(self, message: str) -> None:
        self.emit(Warning(message=message))

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` if the front end asked the job to stop. Call between units of work."""
        if self.cancel.is_set():
            raise Cancelled()


def _named(path: str) -> Any:
    module_name, attribute = path.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def job_function(name: str) -> Callable[[Any, JobContext], BaseModel]:
    """Import and return the function registered under ``name``."""
    return _named(JOBS[name][0])


def request_class(name: str) -> type[BaseModel]:
    """The request model of the job registered under ``name``; importing it imports no torch."""
    return _named(JOBS[name][1])


def request_default(job: str, field: str) -> str:
    """The default of ``field`` in the request of ``job`` as a front end shows it (a help text, a form's
    field): a number in its shortest form (16, 0.0001), and for a field whose None leaves the choice to the
    job, what the job then picks."""
    kind = request_class(job)
    info = kind.model_fields[field]
    if info.is_required():
        raise ValueError(f"{field} of {job} has no default to show")
    value = _picked(kind, field) if info.default is None else info.default
    return f"{value:g}" if isinstance(value, float) else str(value)


def _picked(kind: Any, field: str) -> Any:
    """What None in ``field`` stands for: the value the job then picks, or off for a filter left off."""
    if field == "max_new_tokens":  # at most this many, fewer where the model's context ends sooner
        return kind.default_max_new_tokens
    stands_for: dict[str, str] = getattr(kind, "none_means", {})  # a request's own word for its None
    if field in stands_for:
        return stands_for[field]
    if field == "top_p":
        return "off"
    raise ValueError(f"{field} of {kind.__name__} defaults to None, which a front end cannot show as a value")


def build_job_request(name: str, /, **fields: Any) -> BaseModel:
    """The validated request of job ``name`` from its fields, refusing the first bad one in one sentence."""
    return build_request(request_class(name), **fields)


def run_job(
    name: str,
    request: BaseModel,
    emit: Sink,
    cancel: threading.Event | None = None,
    models: Any = None,
    root: Any = None,
) -> Outcome:
    """Run a job to its end and return its final event, which has also been emitted.

    ``root`` (a :class:`~ster.engine.protocol.confine.Root`) confines every path the job opens to that
    directory, as ``ster serve --root`` promises; its events name paths as the request gave them.
    """
    if root is None:
        return _run(name, request, emit, cancel, models)
    from ster.engine.protocol import confine

    with confine.within(root):
        final: Outcome = confine.shown(_run(name, request, lambda event: emit(confine.shown(event)), cancel, models))
        return final


def _run(name: str, request: BaseModel, emit: Sink, cancel: threading.Event | None, models: Any) -> Outcome:
    ctx = JobContext(emit, cancel or threading.Event(), models)
    final: Outcome
    try:
        document = execute(name, request, ctx)
        final = Result(command=name, data=document.model_dump(mode="json"))
    except SterError as exc:
        final = Error(kind=exc.kind, message=str(exc), details=getattr(exc, "details", None))
    except Exception as exc:  # a bug: report it as one line; the traceback only on request
        if os.environ.get("STER_DEBUG"):
            emit(Log(message=traceback.format_exc()))
        final = Error(kind="internal", message=f"internal error in {name}: {type(exc).__name__}: {exc}")
    emit(final)
    return final


def execute(name: str, request: BaseModel, ctx: JobContext) -> BaseModel:
    """Run job ``name`` and return its document as the job made it (the typed object whose JSON is the result
    event's ``data``), raising what the job raises; :func:`run_job` and the Python API (:mod:`ster.api`) both
    run jobs through here."""
    job = job_function(name)  # may import torch: seconds, during which Ctrl-C may already have come
    ctx.check_cancelled()
    check_before_running(request)  # what lies at its paths: a FIFO as an input, an output inside the model
    with inflight.job_writes(ctx.cancel):  # once cancelled, the job's output is never renamed into place
        return job(request, ctx)
