"""What every job request shares: a frozen pydantic model, the field checks, and one way to build it.

Each area keeps its own requests beside its jobs (``model/requests.py``,
``steering/requests.py``, ``pairs/requests.py``); the CLI builds them from parsed flags
and the TUI from its forms, and a job receives a validated request and nothing else.
Field checks refuse bad values in one sentence each (see :func:`build_request`).
Nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.paths import check_outputs, is_path_field, resolve_inputs

R = TypeVar("R", bound=BaseModel)


class Request(BaseModel):
    """The base of every job request: frozen, and unknown fields are an error.

    Path fields follow one rule (see :mod:`ster.engine.protocol.paths`): those in ``outputs``
    are written, every other one is read. Inputs accept the bundled examples' reserved names;
    an output that is bundled data or the same file as an input is refused here, before the job runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    """The path fields this job writes."""

    @model_validator(mode="before")
    @classmethod
    def _named_inputs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        paths = [name for name, field in cls.model_fields.items() if is_path_field(field.annotation)]
        return resolve_inputs(data, paths, cls.outputs)

    @model_validator(mode="after")
    def _outputs_apart(self) -> Request:
        check_outputs({name: getattr(self, name) for name in type(self).model_fields}, self.outputs)
        return self


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
