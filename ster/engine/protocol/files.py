"""Reading input documents and writing outputs: the one place that touches result files.

Every output is checked before its job runs (:func:`check_output_file`): it must be able
to become a regular file, and it may replace only an older document of its own kind.
Every write goes to a temporary file in the destination's own directory and is
renamed over the destination only once it is complete, so a reader never sees half a
file and a failed or cancelled job leaves nothing behind. A symlink keeps pointing where
it did, and a replaced file keeps its permission bits. A temporary is locked while its write
is in flight, so one that a killed process left is removed by the next write beside it, and
a live writer's never is (see :mod:`ster.engine.protocol.inflight`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ster.engine.protocol import confine, inflight
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.inputs import check_json_text, may_hold_surrogate, read_input_text
from ster.engine.protocol.kinds import (  # re-exported: the kinds of file this module checks
    ACTIVATIONS as ACTIVATIONS,
)
from ster.engine.protocol.kinds import ADAPTER as ADAPTER
from ster.engine.protocol.kinds import ARTIFACT as ARTIFACT
from ster.engine.protocol.kinds import PAIR_SET as PAIR_SET
from ster.engine.protocol.kinds import describe_existing as describe_existing
from ster.engine.protocol.kinds import existing as existing
from ster.engine.protocol.kinds import with_article as with_article

M = TypeVar("M", bound=BaseModel)


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


_UMASK = _umask()
"""Read once at import: temporary files are created private, and get the usual mode before the rename."""


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file, refusing with one sentence when it is missing or malformed.

    A UTF-8 byte-order mark is skipped. A key given twice in one object is refused (naming it)
    rather than letting the last one win unseen, and nesting too deep to parse is refused too.
    Only a regular file is read, never blocking on a FIFO, and a string holding a lone surrogate
    is refused (see :mod:`ster.engine.protocol.inputs`).
    """
    real = confine.readable(path)
    if not real.exists():
        raise Refusal(f"{what} {path} does not exist")
    if real.is_dir():
        raise Refusal(f"{what} {path} is a directory, not a JSON file")
    text = read_input_text(real, what)
    try:
        document = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise Refusal(f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except DuplicateKey as exc:
        raise Refusal(
            f'{what} {path} gives the key "{exc.key}" twice in one object, so which value is meant is ambiguous'
        ) from None
    except RecursionError:
        raise Refusal(f"{what} {path} nests its arrays or objects too deeply to be read") from None
    if may_hold_surrogate(text):
        check_json_text(document, what, path)
    return document


class DuplicateKey(ValueError):
    """A key given twice in one JSON object (raised by :func:`unique_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads`` that refuses a key given twice in one object."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateKey(key)
        document[key] = value
    return document


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes, ``__metadata__``), values unread.

    Raises OSError, struct.error or ValueError for a file that is not one; callers say which file it was.
    """
    with confine.readable(path).open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > 100_000_000:
            raise ValueError("header too large")
        return json.loads(handle.read(length))


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


def check_output_file(
    path: Path, kind: str | None = None, log: Callable[[str], None] | None = None, what: str = "output"
) -> None:
    """Refuse an output path that cannot become a file of ``kind``, before any work is done.

    A symlink is judged by the file it points to, which is what the write replaces. A
    directory, FIFO, socket or device is refused, and so is a destination directory that
    cannot hold a new file (checked by creating and removing one there). With a ``kind``,
    an existing file is replaced only when it is an older document of that kind (said
    through ``log``); anything else there would be destroyed, so it is refused.
    """
    target = confine.writable(path, make=False)
    found = existing(target)
    if found is not None and not found.file:
        raise Refusal(f"{what} {path} is {found.phrase}, not a regular file; give a file path")
    _check_can_hold_a_file(path, what, confine.directory_of_write(path) or target.parent)
    if kind is None or found is None or found.empty:
        return
    if found.kind != kind:
        raise Refusal(
            f"{what} {path} already holds {found.phrase}, which writing {with_article(kind)} there "
            "would destroy; give another path"
        )
    if log is not None:
        log(f"replacing the {kind} at {path}")


def written_path(path: Path) -> Path:
    """The file a write to ``path`` replaces: the target of a symlink, else ``path`` itself (under a
    server's root, the place inside it the job pinned; see :mod:`ster.engine.protocol.confine`)."""
    return confine.writable(path, make=False)


def _check_can_hold_a_file(path: Path, what: str, directory: Path) -> None:
    """Create and remove a file in ``directory``, or its nearest existing ancestor, which the write will go through."""
    while not directory.exists():
        directory = directory.parent
    if not directory.is_dir():
        raise Refusal(f"{what} {path} cannot be written: {directory} is not a directory")
    try:
        fd, probe = inflight.temp_file(prefix=".ster-probe.", suffix=".tmp", dir=directory)
        os.close(fd)
        os.unlink(probe)
        inflight.unregister(probe)
    except OSError as exc:
        raise Refusal(
            f"{what} {path} cannot be written: {directory} cannot hold a new file ({exc.strerror or exc})"
        ) from None


def write_atomic(path: Path, data: str | bytes, keep: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    A symlink at ``path`` stays a symlink: the file it points to is replaced, through a
    temporary file in that file's own directory. An existing file keeps its permission bits.
    An I/O failure is a refusal naming the path; nothing is left behind. Inside a job whose
    cancel flag is set the rename is refused, unless ``keep`` (see :func:`inflight.committing`).
    """
    write_atomic_together([(path, data)], keep)


def write_atomic_together(files: list[tuple[Path, str | bytes]], keep: bool = False) -> None:
    """Write several files that belong together (an adapter and its sidecar): every one is written
    in full to its temporary file first, and only then are they renamed into place, one after the
    other, as one commit."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files:
            staged.append((_stage(path, data), confine.writable(path)))
        with inflight.committing([target for _, target in staged], keep):
            for tmp, target in staged:
                os.replace(tmp, target)
    except BaseException as exc:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _not_written(files[len(staged) - 1 if staged else 0][0], exc) from None
        raise
    finally:
        for tmp, _ in staged:
            inflight.unregister(tmp)


def _stage(path: Path, data: str | bytes) -> str:
    """A complete temporary copy of ``data`` beside the file ``path`` writes, with the mode it will have."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        target = confine.writable(path)
        mode = _mode_for(target)
        fd, tmp = inflight.temp_file(prefix=f".{target.name}.", suffix=inflight.SUFFIX, dir=target.parent)
    except OSError as exc:
        raise _not_written(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        inflight.unregister(tmp)
        if isinstance(exc, OSError):
            raise _not_written(path, exc) from None
        raise
    return tmp


def _mode_for(target: Path) -> int:
    """The permission bits the written file gets: those of the file it replaces, else the usual ones."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_UMASK


def _not_written(path: Path, exc: OSError) -> Refusal:
    return Refusal(f"{path} could not be written: {exc.strerror or exc}")


def dumps_pretty(document: Any) -> str:
    """Pretty JSON with a trailing newline: the form of every document Ster writes or prints."""
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: Path, document: BaseModel) -> None:
    """Validate a document model once more and write it atomically as pretty JSON."""
    type(document).model_validate(document.model_dump())
    write_atomic(path, dumps_pretty(document.model_dump(mode="json")))


def check_output_directory(path: Path, what: str = "output directory") -> None:
    """Refuse a directory output that exists with content, is not a directory, or cannot be created.

    Only nothing or an empty directory may become the output: a directory output replaces no file
    of any kind (the write renames a whole staged directory into place).
    """
    found = existing(confine.writable(path, make=False))
    if found is not None and not found.directory:
        raise Refusal(f"{what} {path} is {found.phrase}, not a directory; give a new or empty directory")
    if found is not None and not found.empty:
        raise Refusal(f"{what} {path} already exists and is not empty (it is {found.phrase}); choose a new path")
    _check_can_hold_a_file(path, what, confine.directory_of_write(path) or path)


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``path`` only if the block succeeds.

    An I/O failure, in the block or in the rename, is a refusal naming the path; nothing is left behind.
    """
    try:
        target = confine.writable(path) if confine.active() else path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(inflight.temp_directory(prefix=f".{target.name}.", suffix=inflight.SUFFIX, dir=target.parent))
    except OSError as exc:
        raise _not_written(path, exc) from None
    try:
        staging = confine.held_directory(tmp)  # under a server's root: written through its descriptor
        yield staging
        os.chmod(staging, 0o777 & ~_UMASK)
        for written in staging.rglob("*"):  # some writers (safetensors) create private files
            os.chmod(written, (0o777 if written.is_dir() else 0o666) & ~_UMASK)
        with inflight.committing([target]):
            if target.is_dir():
                target.rmdir()  # only an empty directory reaches here; check_output_directory saw to it
            os.replace(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _not_written(path, exc) from None
        raise
    finally:
        inflight.unregister(tmp)
