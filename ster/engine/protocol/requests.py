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


SEED_MAX = 2**64 - 1
"""The largest seed a torch generator takes; a seed is an unsigned 64-bit number."""


def at_least_one(value: int, flag: str) -> int:
    if value < 1:
        raise ValueError(f"{flag} must be at least 1")
    return value


def not_negative(value: int, flag: str) -> int:
    if value < 0:
        raise ValueError(f"{flag} must be 0 or more")
    return value


def nucleus(value: float | None) -> float | None:
    if value is not None and not (0 < value <= 1):
        raise ValueError("--top-p must be above 0 and at most 1")
    return value


def between(value: int, low: int, high: int, flag: str) -> int:
    if not low <= value <= high:
        raise ValueError(f"{flag} must be between {low} and {high}")
    return value


def seed(value: int) -> int:
    return between(value, 0, SEED_MAX, "--seed")


def temperature(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError("--temperature must be a finite number of at least 0")
    return value


_WORDING = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "int_type": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "list_type": "must be a comma list",
    "missing": "is required",
}


def _sentence(err: Any) -> str:
    """One sentence for a pydantic error: the flag, what it must be, and what it got."""
    message = str(err["msg"]).removeprefix("Value error, ")
    loc = err["loc"]
    flag = "--" + str(loc[0]).replace("_", "-") if loc else "a field"
    if err["type"] == "value_error":  # a check's own sentence; one that starts "must" is about the field
        return f"{flag} {message}" if message.startswith("must ") else message
    if err["type"] == "literal_error":
        wording = f"must be {err['ctx']['expected']}"
    elif len(loc) > 1 and err["type"] in ("float_parsing", "float_type"):
        wording = "must be a comma list of numbers"
    else:
        wording = _WORDING.get(err["type"])
    if wording is None:
        return f"{flag}: {message}"
    got = err.get("input")
    if isinstance(got, str) and err["type"] != "missing":
        return f'{flag} {wording}; got "{got[:40]}"'
    return f"{flag} {wording}"


def build_request(kind: type[R], /, **fields: Any) -> R:
    """Validate a request, refusing the first bad field in one sentence.

    Values may arrive as text (the CLI passes every flag's value as typed) or typed
    (the TUI's forms, a server): pydantic parses text in its lax mode, and the sentence
    names the flag, what it must be and what it got (``--seed must be a whole number;
    got "x"``).
    """
    try:
        return kind.model_validate(fields)
    except ValidationError as exc:
        raise Refusal(_sentence(exc.errors()[0])) from None
