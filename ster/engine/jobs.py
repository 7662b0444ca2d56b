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

from ster.engine.errors import Cancelled, SterError
from ster.engine.events import Error, Event, Log, Progress, Result, Token, Warning

JOBS: dict[str, str] = {
    "generate": "ster.engine.generate:generate_job",
    "extract": "ster.engine.extract:extract_job",
    "train": "ster.engine.vectors:train_job",
    "optimize": "ster.engine.vectors:optimize_job",
    "evaluate": "ster.engine.vectors:evaluate_job",
    "inspect": "ster.engine.artifact:inspect_job",
    "sweep": "ster.engine.sweep:sweep_job",
    "pairs inspect": "ster.engine.pairs.inspect:inspect_job",
    "pairs add": "ster.engine.pairs.edit:add_job",
    "pairs remove": "ster.engine.pairs.edit:remove_job",
    "pairs save": "ster.engine.pairs.edit:save_job",
    "pairs synthesize": "ster.engine.pairs.synthesize:synthesize_job",
    "workspace import-pairs": "ster.engine.workspace:import_job",
    "workspace show": "ster.engine.workspace:show_job",
    "workspace select": "ster.engine.workspace:select_job",
    "workspace remove": "ster.engine.workspace:remove_job",
    "onboarding": "ster.engine.onboarding:onboarding_job",
    "model import": "ster.engine.gguf_import:import_job",
}
"""Job name → ``module:function``. The name is the command path a user types."""

Sink = Callable[[Event], None]


@dataclass
class JobContext:
    """What a running job may touch: the event sink, the cancel flag, and the model store."""

    emit: Sink
    cancel: threading.Event = field(default_factory=threading.Event)
    _models: Any = None

    @property
    def models(self) -> Any:
        """The :class:`~ster.engine.loading.ModelStore` shared by the jobs of this front end."""
        if self._models is None:
            from ster.engine.loading import ModelStore

            self._models = ModelStore()
        return self._models

    def progress(self, stage: str, message: str, current: int | None = None, total: int | None = None,
                 data: dict[str, Any] | None = None) -> None:
        self.emit(Progress(stage=stage, message=message, current=current, total=total, data=data))

    def token(self, text: str, index: int, stream: str = "text") -> None:
        self.emit(Token(text=text, index=index, stream=stream))

    def log(self, message: str) -> None:
        self.emit(Log(message=message))

    def warn(self, message: str) -> None:
        self.emit(Warning(message=message))

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` if the front end asked the job to stop. Call between units of work."""
        if self.cancel.is_set():
            raise Cancelled()


def job_function(name: str) -> Callable[[Any, JobContext], BaseModel]:
    """Import and return the function registered under ``name``."""
    module_name, function_name = JOBS[name].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def run_job(
    name: str,
    request: BaseModel,
    emit: Sink,
    cancel: threading.Event | None = None,
    models: Any = None,
) -> Event:
    """Run a job to its end and return its final event, which has also been emitted."""
    ctx = JobContext(emit, cancel or threading.Event(), models)
    final: Event
    try:
        document = job_function(name)(request, ctx)
        final = Result(command=name, data=document.model_dump(mode="json"))
    except SterError as exc:
        final = Error(kind=exc.kind, message=str(exc), details=getattr(exc, "details", None))  # type: ignore[arg-type]
    except Exception as exc:  # a bug: report it as one line; the traceback only on request
        if os.environ.get("STER_DEBUG"):
            emit(Log(message=traceback.format_exc()))
        final = Error(kind="internal", message=f"internal error in {name}: {type(exc).__name__}: {exc}")
    emit(final)
    return final
