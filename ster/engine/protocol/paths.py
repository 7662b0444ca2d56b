"""The file fields of a job request: inputs, outputs, and the bundled examples' reserved names.

A request's path fields are read by one rule (see :class:`~ster.engine.protocol.requests.Request`):
the fields a job writes are listed in its ``outputs``, and every other path field is an
input. That is enough to do three things once, for every job, before it runs:

* an input may be a reserved name of a bundled example (``ster:pairs``), resolved here to
  the file inside the package, so the examples work from any directory and in an
  installed package, the way ``ster:toy`` names the bundled model;
* an output may never be bundled data: the examples and the toy are read-only;
* an output that is the same file as an input (the same path, a symlink to it, or a hard
  link) is refused, because writing it would destroy the input before the job had read it.

Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args

from ster.engine.protocol.naming import flag

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
EXAMPLES_DIR = DATA_DIR / "examples"
PREFIX = "ster:"
EXAMPLES: dict[str, str] = {
    "ster:pairs": "pairs.json",
    "ster:prompts": "prompts.json",
    "ster:examples": "examples.json",
    "ster:chat-examples": "chat-examples.json",
    "ster:grpo-prompts": "grpo-prompts.json",
    "ster:neutral": "neutral.json",
}
"""Reserved names of the bundled example inputs: in the toy's vocabulary, the calm/alarmed pair set, a prompt
set, supervised examples (plain and chat) and prompts for reinforcement training; in English, the neutral
set of everyday requests that the cost of an intervention is measured on."""


def example_path(value: str | Path) -> Path:
    """The bundled file a reserved name stands for; any other value is a path as given."""
    text = str(value)
    if not text.startswith(PREFIX):
        return Path(value)
    if text not in EXAMPLES:
        names = ", ".join(EXAMPLES)
        raise ValueError(f"{text} is not a bundled example; the bundled examples are {names}")
    return EXAMPLES_DIR / EXAMPLES[text]


def bundled_name(path: Path) -> str:
    """The reserved name of a bundled example's file, or the path as text for any other file."""
    for name, file in EXAMPLES.items():
        if path == EXAMPLES_DIR / file:
            return name
    return str(path)


def is_path_field(annotation: Any) -> bool:
    """Whether a field holds a file path (``Path`` or ``Path | None``)."""
    return annotation is Path or Path in get_args(annotation)


def resolve_inputs(data: dict[str, Any], path_fields: Iterable[str], outputs: Iterable[str]) -> dict[str, Any]:
    """Map reserved example names in input fields to their files; refuse one given as an output."""
    resolved, written = dict(data), set(outputs)
    for name in path_fields:
        value = data.get(name)
        if value is None or not str(value).startswith(PREFIX):
            continue
        if name in written:
            raise ValueError(f"{flag(name)} {value} names Ster's bundled data, which is read-only; give a file path")
        try:
            resolved[name] = example_path(value)
        except ValueError as exc:
            raise ValueError(f"{flag(name)} {exc}") from None
    return resolved


def check_outputs(values: dict[str, Any], outputs: Iterable[str]) -> None:
    """Refuse an output inside the bundled data or equal to any input, naming both fields."""
    written = [name for name in outputs if isinstance(values.get(name), Path)]
    inputs = [name for name, value in values.items() if isinstance(value, Path) and name not in written]
    for out in written:
        if _inside(values[out], DATA_DIR):
            raise ValueError(
                f"{flag(out)} {values[out]} is inside Ster's bundled data, which is read-only; give a path outside it"
            )
        for name in inputs:
            if same_file(values[out], values[name]):
                raise ValueError(
                    f"{flag(out)} {values[out]} is the same file as {flag(name)} {values[name]}, "
                    f"so writing it would destroy the input; give {flag(out)} another path"
                )


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: equal once symlinks are followed, or one inode when both exist."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _real(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare what was given
        return path.expanduser().absolute()


def _inside(path: Path, directory: Path) -> bool:
    return _real(path).is_relative_to(_real(directory))
