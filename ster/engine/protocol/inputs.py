"""Reading an input: a regular file, opened without blocking, holding text that is text.

Two things an input can be that no check of its content catches:

* not a regular file. A FIFO with no writer blocks ``open`` for reading forever, and a device
  may never end; :func:`read_input` opens with ``O_NONBLOCK`` and looks at what it opened
  before reading a byte, so the check cannot be raced by swapping a FIFO in after it.
  :func:`check_regular_inputs` refuses, before a job runs, every input path of its request
  that is a FIFO, a socket or a device (directories are the business of each reader: some
  inputs are directories);
* text with a lone UTF-16 surrogate. JSON may spell one as ``"\\ud800"`` and a command-line
  argument that is not UTF-8 arrives holding them (Python's ``surrogateescape``); neither is a
  character, so no tokenizer encodes it and no file can be written with it.
  :func:`lone_surrogate` finds the first one, with where it is.

Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.kinds import special_file
from ster.engine.protocol.naming import flag

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
"""How a surrogate can appear in the text of a JSON file (strict UTF-8 decoding refuses any other way)."""


def read_input(path: Path, what: str) -> bytes:
    """The bytes of a regular file, refused in one sentence when it is missing, not a regular file, or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Refusal(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise Refusal(f"{what} {path} could not be read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Refusal(f"{what} {path} is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise Refusal(
                f"{what} {path} is {special_file(mode) or 'not a regular file'}, not a regular file; give a file"
            )
        try:
            return handle.read()
        except OSError as exc:
            raise Refusal(f"{what} {path} could not be read: {exc.strerror or exc}") from None


def read_input_text(path: Path, what: str) -> str:
    """A regular file's UTF-8 text (a byte-order mark skipped), refused in one sentence when it is not text."""
    data = read_input(path, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Refusal(f"{what} {path} could not be read: {exc}") from None


def may_hold_surrogate(text: str) -> bool:
    """Whether JSON text spells a surrogate escape (cheap: most files have none, and need no walk)."""
    return _ESCAPED_SURROGATE.search(text) is not None


def lone_surrogate(value: Any) -> tuple[str, str] | None:
    """Where the first string holding a lone surrogate is (``pairs.0.positive``; ``""`` for ``value`` itself) and
    the surrogate, in document order, keys included; None when every string is text.

    Walks with a stack, not recursion: a document is as deep as its parser allowed."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                return where, found.group()
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                inner = _join(where, str(key))
                stack += [(inner, child), (inner, key)]
        elif isinstance(item, list | tuple):
            stack += [(_join(where, str(index)), child) for index, child in reversed(list(enumerate(item)))]
        elif isinstance(item, BaseModel):  # a document handed over whole (the terminal app's pair editor)
            stack.append((where, item.model_dump()))
    return None


def _join(where: str, part: str) -> str:
    return f"{where}.{part}" if where else part


def surrogate_phrase(surrogate: str) -> str:
    """How a sentence names a surrogate."""
    return f"a lone surrogate (U+{ord(surrogate):04X})"


def check_json_text(document: Any, what: str, path: Path | str) -> None:
    """Refuse a parsed document that holds a lone surrogate, naming where."""
    found = lone_surrogate(document)
    if found is not None:
        where, surrogate = found
        at = f" at {where}" if where else ""
        raise Refusal(
            f"{what} {path} holds {surrogate_phrase(surrogate)}{at}, which is not a character; write the "
            "character itself or a valid surrogate pair"
        )


def check_regular_inputs(request: Any) -> None:
    """Refuse, before a job runs, an input path of its request that is a FIFO, a socket or a device.

    Runs once the request is built (after a server's root check, so it says nothing of paths outside the root).
    """
    written = set(getattr(type(request), "outputs", ()))
    for name in type(request).model_fields:
        value = getattr(request, name, None)
        if name in written or not isinstance(value, Path):
            continue
        try:
            mode = os.stat(confine.readable(value)).st_mode  # under a server's root: walked inside it
        except OSError:
            continue  # missing or unreadable: the reader says which, in its own words
        special = special_file(mode)
        if special is not None:
            raise Refusal(f"{flag(name)} {value} is {special}, not a regular file; give a file")
