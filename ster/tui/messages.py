"""Messages a job's worker thread posts to the widget that started it.

``post_message`` is thread-safe and does not block the worker, so engine events reach
the UI without a widget ever being touched from a thread. The messages bubble: the
pane that owns the job handles them first, then the app (status line, Jobs pane).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from ster.engine.protocol.events import Outcome, Update
    from ster.tui.progress import Step
    from ster.tui.runner import JobHandle


class JobStarted(Message):
    """The job left the queue and is running."""

    def __init__(self, handle: JobHandle, first: Step) -> None:
        super().__init__()
        self.handle = handle
        self.first = first
        """What the job does before its first event (see :func:`ster.tui.progress.first_step`)."""


class JobEvent(Message):
    """One engine event (progress, token, warning or log) of a running job."""

    def __init__(self, handle: JobHandle, event: Update, step: Step | None = None) -> None:
        super().__init__()
        self.handle = handle
        self.event = event
        self.step = step
        """Where the job stands after this event, when the event moved it (see :mod:`ster.tui.progress`)."""


class JobFinished(Message):
    """The job's final event: its result, or an error (refused, cancelled, internal)."""

    def __init__(self, handle: JobHandle, final: Outcome) -> None:
        super().__init__()
        self.handle = handle
        self.final = final


class SettingsChanged(Message, bubble=False):
    """The app sent this to every pane: the model, the pair set or the artifact changed, so results made
    with the old ones are now old."""

    def __init__(self, changed: frozenset[str]) -> None:
        super().__init__()
        self.changed = changed
        """Which settings changed: ``model``, ``pairs``, ``artifact``."""
