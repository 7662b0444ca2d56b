"""Running engine jobs from the app: one at a time, on Textual thread workers.

Jobs run one at a time because they share loaded models, and a steering hook on a
shared decoder must never reach another job's forward pass. The model store is
kept for the life of the app, so the second job on a model does not load it again.
Cancelling sets the job's cancel event, which the engine checks between pairs,
steps and tokens; a cancelled job still ends with its final event.

With a remote (``ster tui --server URL``) every job runs on that server instead: the
runner sends the form's fields as typed (the server validates them, because paths name
its files), and the server's events arrive as the same messages a local engine's do.
Cancelling asks the server to stop the job, and its stream still ends with its final event.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ster.tui.messages import JobEvent, JobFinished, JobStarted
from ster.tui.progress import Step, Track, first_step

if TYPE_CHECKING:
    from pydantic import BaseModel
    from textual.app import App
    from textual.widget import Widget

    from ster.engine.protocol.events import Event, Outcome
    from ster.serve.client import Remote

R = TypeVar("R", bound="BaseModel")
State = Literal["queued", "running", "done", "refused", "cancelled", "failed"]
ENDED: dict[str, State] = {"result": "done", "refused": "refused", "cancelled": "cancelled", "internal": "failed"}
"""A final event (a result, or an error's kind) → the state the job ends in."""


def final_state(final: Outcome) -> State:
    """The state a job ends in, from its final event."""
    return ENDED["result" if final.type == "result" else final.kind]


@dataclass(eq=False)
class JobHandle:
    """One job as the app sees it. Only main-thread message handlers change ``state``."""

    id: int
    name: str
    request: BaseModel | None
    """The validated request (None for a form the app refused before it became a job)."""
    owner: Widget
    fields: dict[str, Any] = field(default_factory=dict)
    """The form's fields as the pane gave them: what a remote runner sends to the server."""
    names: Mapping[str, str] = field(default_factory=dict, repr=False)
    """How the job's sentences name its request's fields: the words of the pane that started it."""
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
    loss: float | None = None
    """The loss of the latest step that reported one (a tune run's progress data)."""
    trained: tuple[int, int] | None = None
    """The optimizer step the latest event reported, of how many, when that event was a training step's."""
    result: dict[str, Any] | None = field(default=None, repr=False)
    """The result document, once the job ended with one (enter on its Jobs row shows it whole)."""
    details: dict[str, Any] | None = field(default=None, repr=False)
    """An error's facts, once the job ended without a result (a cancelled tune run: where it stopped)."""

    def requested(self, kind: type[R]) -> R:
        """The job's request as the class its pane built it with (a pane reading its own job's fields)."""
        if not isinstance(self.request, kind):
            raise TypeError(f"the {self.name} job holds a {type(self.request).__name__}, not a {kind.__name__}")
        return self.request

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")

    @property
    def took(self) -> float | None:
        """Seconds from start to end, once ended."""
        return None if self.started_at is None or self.ended_at is None else self.ended_at - self.started_at


class JobRunner:
    """Starts jobs on worker threads and routes their events back as messages."""

    def __init__(self, app: App, models: Any = None, remote: Remote | None = None) -> None:
        self.app = app
        self._models = models
        self.remote = remote
        """The server every job runs on; None runs them in this process."""
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

    def start(
        self,
        name: str,
        request: BaseModel,
        owner: Widget,
        fields: dict[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> JobHandle:
        handle = JobHandle(
            next(self._ids),
            name,
            request,
            owner,
            dict(fields or {}),
            names=names or {},
            track=Track(name, getattr(request, "max_new_tokens", None) if name == "generate" else None),
        )
        self.handles.append(handle)
        self.app.run_worker(
            lambda: self._work(handle, request),
            name=f"job-{handle.id}",
            group=f"job-{handle.id}",
            description=f"ster {name}",
            exit_on_error=False,
            exclusive=True,
            thread=True,
        )
        return handle

    def _work(self, handle: JobHandle, request: BaseModel) -> None:
        from ster.engine.protocol.events import Error
        from ster.engine.protocol.naming import named

        with self._turn, named(handle.names):
            if handle.cancel.is_set():
                final: Outcome = Error(kind="cancelled", message="cancelled before it started; nothing was written")
            else:
                first = first_step(handle.name) if self.remote is None else Step("", "starting on the server", 0.0)
                handle.owner.post_message(JobStarted(handle, first))
                final = self._run(handle, request, lambda event: self._post(handle, event))
        handle.owner.post_message(JobFinished(handle, final))

    def _run(self, handle: JobHandle, request: BaseModel, emit: Any) -> Outcome:
        """Run the job to its end, here or on the server, and return its final event."""
        if self.remote is None:
            from ster.engine.protocol.jobs import run_job

            return run_job(handle.name, request, emit, handle.cancel, self.models)
        from ster.engine.protocol.events import Error

        try:
            return self.remote.run_job(handle.name, handle.fields, emit, handle.cancel)
        except Exception as exc:  # a reply the client could not read: the job must still end in the app
            return Error(
                kind="internal",
                message=f"internal error reading the Ster server's reply to {handle.name}: {type(exc).__name__}: {exc}",
            )

    def _post(self, handle: JobHandle, event: Event) -> None:
        if event.type == "result" or event.type == "error":
            return  # the final event travels in JobFinished
        step = handle.track.advance(event) if handle.track else None
        handle.owner.post_message(JobEvent(handle, event, step))

    def active(self) -> list[JobHandle]:
        return [handle for handle in self.handles if handle.active]

    def cancel(self, handle: JobHandle | None = None) -> None:
        """Ask one job, or every active job, to stop."""
        for each in [handle] if handle else self.active():
            each.cancel.set()
