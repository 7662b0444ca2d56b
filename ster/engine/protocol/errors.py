"""One small error hierarchy, and the exit code each kind of failure maps to.

A :class:`Refusal` is the engine saying no to its input: a bad flag value, a missing
file, the wrong model. Its message is one plain sentence meant for the person who
typed the command, and a refused job writes nothing.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Literal


class ExitCode(IntEnum):
    """Process exit statuses of the ``ster`` command."""

    OK = 0
    REFUSED = 1
    USAGE = 2
    INTERNAL = 3
    CANCELLED = 130


class SterError(Exception):
    """Base class of every error the engine raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL
    kind: Literal["refused", "cancelled", "internal"] = "internal"


class Refusal(SterError):
    """The input cannot be used; the message is one sentence naming why.

    ``details`` carries machine-readable facts behind the sentence, such as the
    status and error code a gateway answered with.
    """

    exit_code = ExitCode.REFUSED
    kind = "refused"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details


class Cancelled(SterError):
    """The job's cancel flag was set; raised between units of work."""

    exit_code = ExitCode.CANCELLED
    kind = "cancelled"

    def __init__(
        self, message: str = "cancelled before it finished; nothing was written", details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.details = details
        """Where a cancelled run stopped, for a front end that offers to resume it (a tune run: its step, of how
        many, and the checkpoint it left)."""


def first_sentence(exc: BaseException) -> str:
    """A library exception's message cut to its first sentence, without the period, for use inside a refusal's
    one sentence (the exception's type name when it has no message)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0].split(". ")[0].rstrip(".")


def exit_code_for(kind: str) -> ExitCode:
    """Map an error event's ``kind`` back to the process exit status."""
    return {"refused": ExitCode.REFUSED, "cancelled": ExitCode.CANCELLED}.get(kind, ExitCode.INTERNAL)
