"""Reading input documents and writing outputs: the one place that touches result files.

Every write goes to a temporary file in the destination's own directory and is
renamed over the destination only once it is complete, so a reader never sees half a
file and a failed or cancelled job leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import Refusal

M = TypeVar("M", bound=BaseModel)


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


_UMASK = _umask()
"""Read once at import: temporary files are created private, and get the usual mode before the rename."""


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file, refusing with one sentence when it is missing or malformed."""
    if not path.exists():
        raise Refusal(f"{what} {path} does not exist")
    if path.is_dir():
        raise Refusal(f"{what} {path} is a directory, not a JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Refusal(f"{what} {path} could not be read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise Refusal(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def first_error(exc: ValidationError) -> str:
    """The first validation problem as a short phrase: where it is and what is wrong."""
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def known_schema(value: int, known: int) -> int:
    """A document's ``schema_version`` when it is the one this Ster reads; ValueError otherwise."""
    if value != known:
        raise ValueError(f"schema_version {value} is not one this Ster reads (it reads {known})")
    return value


def load_document(path: Path, model: type[M], what: str) -> M:
    """Read ``path`` as JSON and validate it into ``model``, refusing in one sentence."""
    raw = read_json(path, what)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise Refusal(f"{what} {path} is not in the expected shape: {first_error(exc)}") from None


def check_output_file(path: Path, what: str = "output") -> None:
    """Refuse an output path that cannot become a file, before any work is done."""
    if path.is_dir():
        raise Refusal(f"{what} {path} is a directory; give a file path")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise Refusal(f"{what} {path} cannot be written: {parent} is not a writable directory")


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = inflight.temp_file(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        inflight.unregister(tmp)


def dumps_pretty(document: Any) -> str:
    """Pretty JSON with a trailing newline: the form of every document Ster writes or prints."""
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: Path, document: BaseModel) -> None:
    """Validate a document model once more and write it atomically as pretty JSON."""
    type(document).model_validate(document.model_dump())
    write_atomic(path, dumps_pretty(document.model_dump(mode="json")))


def check_output_directory(path: Path, what: str = "output directory") -> None:
    """Refuse a directory output that exists with content or cannot be created."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise Refusal(f"{what} {path} already exists and is not empty; choose a new path")
    check_output_file(path / "probe", what)


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``path`` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(inflight.temp_directory(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_UMASK)
        for written in tmp.rglob("*"):  # some writers (safetensors) create private files
            os.chmod(written, (0o777 if written.is_dir() else 0o666) & ~_UMASK)
        if path.is_dir():
            path.rmdir()  # only an empty directory reaches here; check_output_directory saw to it
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        inflight.unregister(tmp)
