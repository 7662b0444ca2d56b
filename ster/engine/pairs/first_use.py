"""First-use progress: the state file the walkthrough keeps, and the notes that end it.

``onboarding.json`` under ``$XDG_STATE_HOME/ster`` (else ``~/.local/state/ster``) records
how far first use got. Writing or importing a pair set anywhere in the engine ends the
walkthrough through :func:`note_pair_set_written` / :func:`note_pair_set_imported`, so
this module sits below both the pair-set jobs and the walkthrough itself. Progress is
state, not data: recording it never fails a write that already happened.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import Refusal, SterError
from ster.engine.protocol.files import dumps_pretty, known_schema, load_document, write_atomic

SCHEMA_VERSION = 1
STATE_FILE = "onboarding.json"


class OnboardingState(BaseModel):
    """``onboarding.json``: how far first use got."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    completed: bool = False
    completed_at: str | None = None
    """When a pair set was first imported or written, UTC, ISO 8601."""
    how: str | None = None
    """What completed it: ``imported <id>`` or ``wrote <path>``."""
    screens_seen: int = 0
    """How many screens have been shown so far."""

    _version = field_validator("schema_version")(lambda cls, v: known_schema(v, SCHEMA_VERSION))


def state_root() -> Path:
    """``$XDG_STATE_HOME/ster``, else ``~/.local/state/ster``; read at each call so tests can move it."""
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base else Path.home() / ".local" / "state") / "ster"


def state_path() -> Path:
    return state_root() / STATE_FILE


def read_state() -> OnboardingState:
    """The saved progress, a fresh start when there is none; a damaged file is refused with the way out."""
    path = state_path()
    if not path.exists():
        return OnboardingState()
    try:
        return load_document(path, OnboardingState, "onboarding progress")
    except Refusal as exc:
        raise Refusal(f"{exc}; run ster onboarding --reset to start over") from None


def note_pair_set_written(path: Path) -> None:
    """Called after ``pairs add`` / ``pairs synthesize`` wrote a set: ends the walkthrough. Never raises for I/O."""
    try:
        mark_complete(f"wrote {Path(path).absolute()}")
    except (OSError, ValueError, SterError):
        pass  # the pair set is written; failing to record progress must not fail that


def note_pair_set_imported(set_id: str) -> None:
    """Called after ``workspace import-pairs``: ends the walkthrough. Never raises for I/O, like the above."""
    try:
        mark_complete(f"imported {set_id}")
    except (OSError, ValueError, SterError):
        pass


def mark_complete(how: str) -> None:
    """Record completion unless it is already recorded; a damaged progress file is replaced."""
    try:
        state = read_state()
    except Refusal:
        state = OnboardingState()
    if not state.completed:
        save(state.model_copy(update={"completed": True, "completed_at": now(), "how": how}))


def reset() -> None:
    path = state_path()
    try:
        with inflight.committing([path]):  # a deletion is a commit too: Ctrl-C after it no longer cancels
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise Refusal(f"onboarding progress {path} could not be deleted: {exc.strerror or exc}") from None


def save(state: OnboardingState) -> None:
    write_atomic(state_path(), dumps_pretty(OnboardingState.model_validate(state.model_dump()).model_dump(mode="json")))


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
