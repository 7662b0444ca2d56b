"""The workspace: persistent, canonical copies of pair sets, one of them active.

``ster workspace import-pairs FILE`` validates the whole pair set, keeps a canonical
copy of it under the workspace root (``$XDG_DATA_HOME/ster``, else
``~/.local/share/ster``) and makes it the active set, so ``train``, ``optimize``,
``evaluate`` and ``pairs inspect`` can run without ``--pairs``. The layout is::

    <root>/index.json        {schema_version, active, entries: [{id, file, digest, ...}]}
    <root>/pairs/<id>.json   the canonical copy: pretty JSON with a trailing newline
    <root>/index.lock        held (flock) around every read-modify-write of the index

The canonical copy is the set re-serialised through :class:`PairSet`, so two files that
differ only in whitespace or key order are the same content; its sha256 (``digest``)
decides what an import does:

* ``imported``: new content under a free id: the copy is written and becomes active;
* ``unchanged``: the same content is already kept (under any id): that set becomes
  active and nothing is copied;
* ``conflicting``: the id is taken by different content. This is a :class:`Refusal`
  (exit 1, one sentence naming the existing copy, nothing written), like a rejected
  file, because the command did not do what was asked and a script must notice;
  the first set is never overwritten. The error event's ``details`` carry
  ``status: "conflicting"`` for front ends that want the outcome as data.

Content is checked before the id, so re-importing a set under a new name that is
already taken by other content reports ``unchanged`` (the kept copy is what the user
meant to use) rather than ``conflicting``.

Every index write is atomic (a temporary file renamed over ``index.json``), and each
read-modify-write holds an exclusive ``flock`` on ``index.lock``, so two imports in
two processes never lose an entry. Readers (``show``, :func:`active_pairs`) take no
lock: a rename is atomic, so they see the old index or the new one. The copy is
written before the index names it and the index forgets an entry before its copy is
deleted, so a crash leaves at worst an unlisted file, never an entry without a copy.

Nothing here imports torch, transformers or textual.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from ster.engine.pairs.first_use import note_pair_set_imported
from ster.engine.pairs.model import PairSet, load_pairs
from ster.engine.pairs.requests import (
    WorkspaceImportRequest,
    WorkspaceRemoveRequest,
    WorkspaceSelectRequest,
    WorkspaceShowRequest,
)
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import dumps_pretty, known_schema, load_document, write_atomic
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag

try:  # POSIX only; elsewhere the index is still written atomically, just unlocked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # (no module here: the name says so)

SCHEMA_VERSION = 1
INDEX_FILE = "index.json"
LOCK_FILE = "index.lock"
PAIRS_DIR = "pairs"
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
ID_RULE = 'lowercase letters, digits, ".", "_" and "-", starting with a letter or digit, at most 64 characters'
"""Ids name files; lowercase only so two ids never collide on a case-insensitive filesystem."""
IMPORT_HINT = "ster workspace import-pairs FILE"


class Entry(BaseModel):
    """One imported set, as the index records it."""

    model_config = ConfigDict(extra="forbid")
    id: str
    """The set's name in the workspace; also its copy's file name."""
    file: str
    """The canonical copy, relative to the workspace root, so the root can move."""
    digest: str
    """sha256 (hex) of the canonical copy's bytes: what makes two imports the same content."""
    trait_name: str
    pair_count: int
    imported_at: str
    """When the copy was written, UTC, ISO 8601."""
    source: str
    """The absolute path the set was imported from (informational; it may since have changed)."""


class Index(BaseModel):
    """``index.json``: every imported set and which one is active."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    active: str | None = None
    """The id ``--pairs`` defaults to; null when no set is active."""
    entries: list[Entry] = []

    _version = field_validator("schema_version")(lambda cls, v: known_schema(v, SCHEMA_VERSION))

    def find(self, set_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == set_id), None)


class ImportOutcome(BaseModel):
    """What an import did: ``ster workspace import-pairs`` prints this."""

    status: Literal["imported", "unchanged"]
    """``imported``: a copy was written; ``unchanged``: the content was already kept, nothing copied."""
    id: str
    """The id of the set now active (for ``unchanged``, the id the content was first kept under)."""
    path: str
    """The canonical copy's absolute path: what ``--pairs`` now defaults to."""
    source: str
    """The absolute path of the file that was imported."""
    digest: str
    trait_name: str
    pair_count: int
    active: str
    """The active set's id after the import (always ``id``)."""
    reason: str
    """One sentence saying what happened and why."""


class SetView(BaseModel):
    """One imported set as ``show`` reports it."""

    id: str
    path: str
    """The canonical copy's absolute path."""
    present: bool
    """Whether the copy is still on disk; a missing copy cannot be used until it is imported again."""
    active: bool
    digest: str
    trait_name: str
    pair_count: int
    imported_at: str
    source: str


class WorkspaceView(BaseModel):
    """What ``ster workspace show`` prints."""

    root: str
    """The workspace directory (``$XDG_DATA_HOME/ster`` or ``~/.local/share/ster``)."""
    active: str | None
    """The active set's id, or null."""
    sets: list[SetView]
    """Every imported set, in import order."""


class SelectResult(BaseModel):
    """What ``ster workspace select`` prints."""

    active: str
    path: str
    """The canonical copy that ``--pairs`` now defaults to."""
    previous: str | None
    """The set that was active before, or null."""


class RemoveResult(BaseModel):
    """What ``ster workspace remove`` prints."""

    removed: str
    path: str
    """The deleted copy."""
    copy_deleted: bool
    """False when the copy was already gone; the entry is forgotten either way."""
    active: str | None
    """The active set after the removal: null when the removed set was the active one."""


def workspace_root() -> Path:
    """``$XDG_DATA_HOME/ster``, else ``~/.local/share/ster``; read at each call so tests can move it."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "ster"


def active_pairs() -> Path:
    """The active set's canonical copy: what ``--pairs`` defaults to, refused when there is none to use."""
    root = workspace_root()
    index = _read_index(root)
    entry = index.find(index.active) if index.active else None
    if entry is None:
        raise Refusal(
            f"no pair set is active in the workspace; give {flag('pairs')} FILE, or import one with {IMPORT_HINT}",
            details={"needs": "pairs"},
        )
    path = root / entry.file
    if not path.is_file():
        raise Refusal(
            f'the active pair set "{entry.id}" has lost its copy {path}; import it again with '
            f"{IMPORT_HINT}, or select another set with ster workspace select ID"
        )
    return path


def import_pair_set(source: Path, name: str | None) -> ImportOutcome:
    """Validate ``source`` whole, keep its canonical copy under an id, and make it active.

    Shared by ``ster workspace import-pairs`` and ``ster onboarding --import-pairs``.
    Refuses a rejected file or a conflicting id before anything is written.
    """
    pair_set = load_pairs(source)
    set_id = _id_for(source, name)
    canonical = canonical_text(pair_set)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    root = workspace_root()
    with _locked(root):
        index = _read_index(root)
        kept = next((e for e in index.entries if e.digest == digest), None)
        if kept is not None:
            return _reuse(root, index, kept, canonical, source)
        taken = index.find(set_id)
        if taken is not None:
            raise _conflict(root, taken)
        entry = Entry(
            id=set_id,
            file=f"{PAIRS_DIR}/{set_id}.json",
            digest=digest,
            trait_name=pair_set.trait_name,
            pair_count=len(pair_set.pairs),
            imported_at=_now(),
            source=str(source.resolve()),
        )
        write_atomic(root / entry.file, canonical)
        _write_index(root, index.model_copy(update={"active": set_id, "entries": [*index.entries, entry]}))
    return _outcome("imported", root, entry, source, f'imported {source} as "{set_id}" and made it the active set')


def load_pairs_or_active(path: Path | None) -> tuple[Path, PairSet]:
    """The given pair set, or the workspace's active one when no path is given."""
    if path is None:
        path = active_pairs()
    return path, load_pairs(path)


def canonical_text(pair_set: PairSet) -> str:
    """The bytes a copy holds and its digest covers: pretty JSON of the validated set, trailing newline."""
    return dumps_pretty(pair_set.model_dump(mode="json"))


def import_job(request: WorkspaceImportRequest, ctx: JobContext) -> ImportOutcome:
    """``ster workspace import-pairs``: an import also ends the first-use walkthrough."""
    outcome = import_pair_set(request.source, request.name)
    ctx.log(outcome.reason)
    note_pair_set_imported(outcome.id)
    return outcome


def show_job(request: WorkspaceShowRequest, ctx: JobContext) -> WorkspaceView:
    """``ster workspace show``: reads only, so it never creates the workspace."""
    root = workspace_root()
    index = _read_index(root)
    sets = [_view(root, entry, entry.id == index.active) for entry in index.entries]
    if not sets:
        ctx.log(f"the workspace holds no pair sets yet; import one with {IMPORT_HINT}")
    return WorkspaceView(root=str(root), active=index.active, sets=sets)


def select_job(request: WorkspaceSelectRequest, ctx: JobContext) -> SelectResult:
    """``ster workspace select ID``: refuses an unknown id, or one whose copy is gone."""
    root = workspace_root()
    _require_known(_read_index(root), request.id)  # refuse before the lock creates anything
    with _locked(root):
        index = _read_index(root)
        entry = _require_known(index, request.id)
        path = root / entry.file
        if not path.is_file():
            raise Refusal(f'pair set "{entry.id}" has lost its copy {path}; import it again with {IMPORT_HINT}')
        if index.active != entry.id:
            _write_index(root, index.model_copy(update={"active": entry.id}))
    ctx.log(f'"{entry.id}" is the active pair set')
    return SelectResult(active=entry.id, path=str(path), previous=index.active)


def remove_job(request: WorkspaceRemoveRequest, ctx: JobContext) -> RemoveResult:
    """``ster workspace remove ID``: forget the entry, then delete its copy; removing the active set leaves none."""
    root = workspace_root()
    _require_known(_read_index(root), request.id)
    with _locked(root):
        index = _read_index(root)
        entry = _require_known(index, request.id)
        active = None if index.active == entry.id else index.active
        entries = [e for e in index.entries if e.id != entry.id]
        _write_index(root, index.model_copy(update={"active": active, "entries": entries}))
        path = root / entry.file
        present = path.is_file()
        path.unlink(missing_ok=True)
    if index.active == entry.id:
        ctx.log(f'removed the active set "{entry.id}"; no pair set is active now')
    return RemoveResult(removed=entry.id, path=str(path), copy_deleted=present, active=active)


def _reuse(root: Path, index: Index, kept: Entry, canonical: str, source: Path) -> ImportOutcome:
    """The content is already kept: make that set active; restore its copy only if it was deleted."""
    path = root / kept.file
    if not path.is_file():
        write_atomic(path, canonical)
        reason = f'{source} is the content of "{kept.id}", whose deleted copy was restored; it is the active set'
        status: Literal["imported", "unchanged"] = "imported"
    else:
        reason = f'{source} is already kept as "{kept.id}", so nothing was copied; it is the active set'
        status = "unchanged"
    if index.active != kept.id:
        _write_index(root, index.model_copy(update={"active": kept.id}))
    return _outcome(status, root, kept, source, reason)


def _conflict(root: Path, taken: Entry) -> Refusal:
    path = root / taken.file
    return Refusal(
        f'conflicting: the workspace already keeps a different pair set as "{taken.id}" ({path}), which '
        f"is never overwritten; import under another {flag('name')}, or first run ster workspace remove {taken.id}",
        details={"status": "conflicting", "id": taken.id, "existing": str(path)},
    )


def _outcome(
    status: Literal["imported", "unchanged"], root: Path, entry: Entry, source: Path, reason: str
) -> ImportOutcome:
    return ImportOutcome(
        status=status,
        id=entry.id,
        path=str(root / entry.file),
        source=str(source.resolve()),
        digest=entry.digest,
        trait_name=entry.trait_name,
        pair_count=entry.pair_count,
        active=entry.id,
        reason=reason,
    )


def _view(root: Path, entry: Entry, active: bool) -> SetView:
    path = root / entry.file
    return SetView(
        id=entry.id,
        path=str(path),
        present=path.is_file(),
        active=active,
        digest=entry.digest,
        trait_name=entry.trait_name,
        pair_count=entry.pair_count,
        imported_at=entry.imported_at,
        source=entry.source,
    )


def _id_for(source: Path, name: str | None) -> str:
    """The id from ``--name``, else the file name without ``.json``; refused unless it is a safe slug."""
    if name is not None:
        if not ID_PATTERN.fullmatch(name):
            raise Refusal(f'{flag("name")} "{name}" is not a valid set id: use {ID_RULE}')
        return name
    stem = source.name.removesuffix(".json")
    if not ID_PATTERN.fullmatch(stem):
        raise Refusal(
            f"the file name {source.name} does not make a valid set id ({ID_RULE}); give one with {flag('name')}"
        )
    return stem


def _require_known(index: Index, set_id: str) -> Entry:
    entry = index.find(set_id)
    if entry is None:
        known = ", ".join(f'"{e.id}"' for e in index.entries)
        where = (
            f"the known sets are {known}" if known else f"the workspace holds none yet; import one with {IMPORT_HINT}"
        )
        raise Refusal(f'no pair set "{set_id}" in the workspace; {where}')
    return entry


def _read_index(root: Path) -> Index:
    """The index, or an empty one when the workspace does not exist yet; a damaged index is refused, never rewritten."""
    path = root / INDEX_FILE
    if not path.exists():
        return Index()
    return load_document(path, Index, "workspace index")


def _write_index(root: Path, index: Index) -> None:
    write_atomic(root / INDEX_FILE, dumps_pretty(Index.model_validate(index.model_dump()).model_dump(mode="json")))


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold the workspace's exclusive lock: one read-modify-write of the index at a time, across processes."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise Refusal(f"the workspace {root} cannot be written: {exc.strerror or exc}") from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
