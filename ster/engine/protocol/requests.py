"""What every job request shares: a frozen pydantic model, the field checks, and one way to build it.

Each area keeps its own requests beside its jobs (``model/requests.py``,
``steering/requests.py``, ``pairs/requests.py``); the CLI builds them from parsed flags
and the TUI from its forms, and a job receives a validated request and nothing else.
Field checks refuse bad values in one sentence each (see :func:`build_request`).
Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.inputs import check_regular_inputs, lone_surrogate, surrogate_phrase
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import PREFIX, check_outputs, is_path_field, resolve_inputs

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
    directory_outputs: ClassVar[tuple[str, ...]] = ()
    """Those of ``outputs`` that are directories (a checkpoint, a PEFT adapter); the others are files."""

    @model_validator(mode="before")
    @classmethod
    def _named_inputs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = blank_means_none(cls, data)
        check_text_values(data)
        check_file_outputs(data, [name for name in cls.outputs if name not in cls.directory_outputs])
        paths = [name for name, field in cls.model_fields.items() if is_path_field(field.annotation)]
        return resolve_inputs(data, paths, cls.outputs)

    @model_validator(mode="after")
    def _outputs_apart(self) -> Request:
        check_outputs({name: getattr(self, name) for name in type(self).model_fields}, self.outputs)
        return self


def check_before_running(request: BaseModel) -> None:
    """The checks that look at what lies at a request's paths, made as its job starts rather than when it is
    built, so that a server has confined every path to its root first and a refusal says nothing of what exists
    outside it: no input is a FIFO or a device, and no output lies inside the checkpoint the job reads."""
    check_regular_inputs(request)
    values = {name: getattr(request, name) for name in type(request).model_fields}
    try:
        check_outside_model(values, getattr(type(request), "outputs", ()))
    except ValueError as exc:
        raise Refusal(str(exc)) from None


def _optional_text(annotation: Any) -> bool:
    """Whether a field holds an optional text (``str | None``)."""
    args = get_args(annotation)
    return str in args and type(None) in args


def blank_means_none(kind: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """A blank value (empty or only spaces) of a path field, the model or an optional text means none, as the
    contract says: None where the field is optional, and not given where it is required (so it is refused as
    missing, never read as the current directory ``Path("")`` is)."""
    cleaned = dict(data)
    for name, field in kind.model_fields.items():
        value = data.get(name)
        if not (isinstance(value, str) and not value.strip()):
            continue
        if is_path_field(field.annotation) or name == "model" or _optional_text(field.annotation):
            if field.is_required():
                del cleaned[name]
            else:
                cleaned[name] = None
    return cleaned


def check_text_values(data: dict[str, Any]) -> None:
    """Refuse a value holding a lone surrogate (JSON's ``"\\ud800"``, or an argument that is not UTF-8): no
    tokenizer encodes it, and no document can be written with it."""
    found = lone_surrogate(data)
    if found is None:
        return
    where, surrogate = found
    name, _, inner = where.partition(".")
    at = f" at {inner}" if inner else ""
    raise ValueError(
        f"{flag(name)} holds {surrogate_phrase(surrogate)}{at}, which is not a character; give valid UTF-8 text"
    )


def check_file_outputs(data: dict[str, Any], files: list[str]) -> None:
    """Refuse a file output spelled as a directory (``out/``): the slash is lost once it is a path, and the
    write would then make a file where a directory was meant."""
    for name in files:
        value = data.get(name)
        if isinstance(value, str) and value.rstrip().endswith(("/", "/.", os.sep, f"{os.sep}.")):
            raise ValueError(
                f"{flag(name)} {value} ends in {os.sep}, so it names a directory; {flag(name)} takes a file path"
            )


def check_outside_model(values: dict[str, Any], outputs: tuple[str, ...]) -> None:
    """Refuse an output inside the checkpoint the job reads: writing there could replace its weights."""
    model = values.get("model")
    root = model_directory(model) if isinstance(model, str) else None
    if root is None:
        return
    for name in outputs:
        value = values.get(name)
        if isinstance(value, Path) and _inside(value, root):
            raise ValueError(
                f"{flag(name)} {value} is inside {root}, the checkpoint {flag('model')} {model} reads, so "
                f"writing it could destroy the model; give {flag(name)} a path outside it"
            )


def model_directory(model: str) -> Path | None:
    """The directory a ``--model`` value reads: a local directory, or a Hub id's folder in the Hugging Face cache
    (found as huggingface_hub finds it, without importing it); None for a bundled name or anything else."""
    if model.startswith(PREFIX) or not model.strip():
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if _HUB_ID.match(model) and ".." not in model:
        return _hub_cache() / ("models--" + model.replace("/", "--"))
    return None


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or lies under it, once symlinks are followed (a link into it counts)."""
    real = Path(os.path.realpath(path.expanduser()))
    return real.is_relative_to(os.path.realpath(root))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
"""What resolution takes for a Hub id (see :mod:`ster.engine.model.resolve`)."""


def _hub_cache() -> Path:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


SEED_MAX = 2**64 - 1
"""The largest seed a torch generator takes; a seed is an unsigned 64-bit number."""


def at_least_one(value: int, field: str) -> int:
    if value < 1:
        raise ValueError(f"{flag(field)} must be at least 1")
    return value


def not_negative(value: int, field: str) -> int:
    if value < 0:
        raise ValueError(f"{flag(field)} must be 0 or more")
    return value


def nucleus(value: float | None) -> float | None:
    if value is not None and not (0 < value <= 1):
        raise ValueError(f"{flag('top_p')} must be above 0 and at most 1")
    return value


def between(value: int, low: int, high: int, field: str) -> int:
    if not low <= value <= high:
        raise ValueError(f"{flag(field)} must be between {low} and {high}")
    return value


def seed(value: int) -> int:
    return between(value, 0, SEED_MAX, "seed")


def temperature(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{flag('temperature')} must be a finite number of at least 0")
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
    field = flag(str(loc[0])) if loc else "a field"
    if err["type"] == "value_error":  # a check's own sentence; one that starts "must" is about the field
        return f"{field} {message}" if message.startswith("must ") else message
    if err["type"] == "literal_error":
        wording = f"must be {err['ctx']['expected']}"
    elif len(loc) > 1 and err["type"] in ("float_parsing", "float_type"):
        wording = "must be a comma list of numbers"
    else:
        found = _WORDING.get(err["type"])
        if found is None:
            return f"{field}: {message}"
        wording = found
    got = err.get("input")
    if isinstance(got, str) and err["type"] != "missing":
        return f'{field} {wording}; got "{got[:40]}"'
    return f"{field} {wording}"


def refusal_of(kind: type[BaseModel], valid: dict[str, Any], field: str, value: Any) -> str | None:
    """The sentence refusing ``value`` for ``field`` in a request that is otherwise ``valid`` (the fields of a
    request that passes), or None when the value passes: one field checked by the request's own checks, as a
    form checks a field while the rest of it may still be unfinished."""
    try:
        kind.model_validate({**valid, field: value})
    except ValidationError as exc:
        return _sentence(exc.errors()[0])
    return None


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
