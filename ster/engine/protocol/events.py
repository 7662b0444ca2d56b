"""The closed set of events a job emits.

Every front end (the CLI's plain and rich renderers, ``ster --json``, the TUI)
consumes exactly these. They are frozen pydantic models with a ``type``
discriminator, so one NDJSON line parses back into the same event with
:func:`parse_event`. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> str:
        """One compact JSON object, as written to an NDJSON stream."""
        return self.model_dump_json()


class Progress(_Event):
    """A step of a longer stage: loading, reading pair i of n, decoding."""

    type: Literal["progress"] = "progress"
    stage: str
    """Short machine name of the stage, e.g. ``load`` or ``read``."""
    current: int | None = None
    """Units done so far in this stage, when the stage is countable."""
    total: int | None = None
    """Units the stage will do, when known in advance."""
    message: str
    """A plain sentence a person can read on its own."""
    data: dict[str, Any] | None = None
    """Structured detail of the step, when a front end can show more than the sentence
    (for example the pair synthesis just kept)."""


class Token(_Event):
    """Text generation produced: the decoded delta of one or more new tokens."""

    type: Literal["token"] = "token"
    text: str
    """Text to append to what was streamed before; concatenated, the deltas are the result's text."""
    index: int
    """Zero-based index of the newest generated token the delta covers."""
    stream: str = "text"
    """Which output the delta belongs to, for jobs that generate more than one text."""


class Warning(_Event):
    """Something the operator should know that does not stop the job."""

    type: Literal["warning"] = "warning"
    message: str


class Log(_Event):
    """An informational sentence, such as the chat-template decision or a timing."""

    type: Literal["log"] = "log"
    message: str
    data: dict[str, Any] | None = None
    """The fact the sentence states, for a front end that acts on it rather than shows it (the chat-template
    decision: ``{"chat_template": "applied"}``); absent from the JSON line when there is none."""

    def to_json(self) -> str:
        return self.model_dump_json(exclude={"data"} if self.data is None else None)


class Result(_Event):
    """The job's document: what ``ster <command>`` prints on stdout. Exactly one per job, or an error."""

    type: Literal["result"] = "result"
    command: str
    data: dict[str, Any]


class Error(_Event):
    """The job ended without a result. Exactly one per job, or a result."""

    type: Literal["error"] = "error"
    kind: Literal["refused", "cancelled", "internal"]
    message: str
    details: dict[str, Any] | None = None
    """Machine-readable facts behind the sentence (for example a gateway's error code)."""


Event = Annotated[Progress | Token | Warning | Log | Result | Error, Field(discriminator="type")]
"""Any event; the ``type`` field says which."""
Update = Progress | Token | Warning | Log
"""An event of a running job: any event but the final one."""
Outcome = Result | Error
"""How a job ended: its result or its error, exactly one per job; ``type`` narrows which."""

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str) -> Event:
    """Parse one NDJSON line back into its event."""
    return _EVENT_ADAPTER.validate_json(line)
