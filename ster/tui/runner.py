"""Running engine jobs from the app: one at a time, on Textual thread workers.

Jobs run one at a time because they share loaded models, and a steering hook on a
shared decoder must never reach another job's forward pass. The model store is
kept for the life of the app, so the second job on a model does not load it again.
Cancelling sets the job's cancel event, which the engine checks between pairs,
steps and tokens; a cancelled job still ends with its final event.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ster.tui.messages import JobEvent, JobFinished, JobStarted
from ster.tui.progress import Step, Track, first_step

if TYPE_CHECKING:
    from pydantic import BaseModel
    from textual.app import App
    from textual.widget import Widget

    from ster.engine.protocol.events import Event

State = Literal["queued", "running", "done", "refused", "cancelled", "failed"]
ENDED: dict[str, State] = {"result": "done", "refused": "refused", "cancelled": "cancelled", "internal": "failed"}
"""A final event (a result, or an error's kind) → the state the job ends in."""


def final_state(final: Event) -> State:
    """The state a job ends in, from its final event."""
    return ENDED["result" if final.type == "result" else final.kind]  # type: ignore[union-attr]


@dataclass(eq=False)
class JobHandle:
    """One job as the app sees it. Only main-thread message handlers change ``state``."""

    id: int
    name: str
    request: BaseModel
    owner: Widget
    cancel: threading.Event = field(default_factory=threading.Event)
    state: State = "queued"
    last_message: str = ""
    step: Step | None = None
    """Where the running job stands, as its latest message said."""
    started_at: float | None = None
    ended_at: float | None = None
    """When the job left the queue and when it ended, by the app's clock."""
    track: Track | None = field(default=None, repr=False)
    """The job's progress reader; only its worker thread advances it."""

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")

    @property
    def took(self) -> float | None:
        """Seconds from start to end, once ended."""
        return None if self.started_at is None or self.ended_at is None else self.ended_at - self.started_at


class JobRunner:
    """Starts jobs on worker threads and routes their events back as messages."""

    def __init__(self, app: App, models: Any = None) -> None:
        self.app = app
        self._models = models
        self._turn = threading.Lock()
        self._ids = itertools.count(1)
        self.handles: list[JobHandle] = []

    @property
    def models(self) -> Any:
        """The engine's model store, created on first use (importing it imports no torch)."""
        if self._models is None:
            from ster.engine.model.loading import ModelStore

            self._models = ModelStore()
        return self._models

    def start(self, name: str, request: BaseModel, owner: Widget) -> JobHandle:
        handle = JobHandle(next(self._ids), name, request, owner,
                           track=Track(name, getattr(request, "max_new_tokens", None) if name == "generate" else None))
        self.handles.append(handle)
        self.app.run_worker(lambda: self._work(handle), name=f"job-{handle.id}", group=f"job-{handle.id}",
                            description=f"ster {name}", exit_on_error=False, exclusive=True, thread=True)
        return handle

    def _work(self, handle: JobHandle) -> None:
        from ster.engine.protocol.events import Error
        from ster.engine.protocol.jobs import run_job

        models = self.models
        with self._turn:
            if handle.cancel.is_set():
                final: Event = Error(kind="cancelled", message="cancelled before it started; nothing was written")
            else:
                handle.owner.post_message(JobStarted(handle, first_step(handle.name)))
                final = run_job(handle.name, handle.request, lambda event: self._post(handle, event), handle.cancel,
                                models)
        handle.owner.post_message(JobFinished(handle, final))

    def _post(self, handle: JobHandle, event: Event) -> None:
        if event.type not in ("result", "error"):  # the final event travels in JobFinished
            step = handle.track.advance(event) if handle.track else None
            handle.owner.post_message(JobEvent(handle, event, step))

    def active(self) -> list[JobHandle]:
        return [handle for handle in self.handles if handle.active]

    def cancel(self, handle: JobHandle | None = None) -> None:
        """Ask one job, or every active job, to stop."""
        for each in [handle] if handle else self.active():
            each.cancel.set()
