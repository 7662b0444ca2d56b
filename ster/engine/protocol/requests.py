"""What every job request shares: a frozen pydantic model, the field checks, and one way to build it.

Each area keeps its own requests beside its jobs (``model/requests.py``,
``steering/requests.py``, ``pairs/requests.py``); the CLI builds them from parsed flags
and the TUI from its forms, and a job receives a validated request and nothing else.
Field checks refuse bad values in one sentence each (see :func:`build_request`).
Nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ster.engine.protocol.errors import Refusal

R = TypeVar("R", bound=BaseModel)


class Request(BaseModel):
    """The base of every job request: frozen, and unknown fields are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def at_least_one(value: int, flag: str) -> int:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1")
    return value


def nucleus(value: float | None) -> float | None:
    if value is not None and not (0 < value <= 1):
        raise ValueError("--top-p must be above 0 and at most 1")
    return value


def between(value: int, low: int, high: int, flag: str) -> int:
    if not low <= value <= high:
        raise ValueError(f"{flag} must be between {low} and {high}")
    return value


def finite(value: float, flag: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number")
    return value


def build_request(kind: type[R], /, **fields: Any) -> R:
    """Validate a request, refusing the first bad field in one sentence."""
    try:
        return kind.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] != "value_error":
            flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "a field"
            message = f"{flag}: {message}"
        raise Refusal(message) from None
