"""What a path already holds, so an output never destroys something of another kind.

A job that writes a document names its kind (:data:`ARTIFACT`, :data:`ACTIVATIONS`,
:data:`PAIR_SET`); before it runs, :func:`ster.engine.protocol.files.check_output_file`
lets it replace only an older document of that same kind. A kind is recognised cheaply,
by parsing the JSON and looking at the keys that tell Ster's documents apart (the same
test the artifact loader uses to tell a steering artifact from an adapter sidecar).
:func:`existing` says what lies at a path, and :func:`describe_existing` says it in a few
words, for refusals and for the terminal app's question before it overwrites. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARTIFACT = "steering artifact"
ACTIVATIONS = "activation document"
PAIR_SET = "pair set"
PROMPT_SET = "prompt set"
ADAPTER_SIDECAR = "LoRA adapter sidecar"
CALIBRATION_STUDY = "calibration study"
"""The trials ``ster calibrate`` has finished, kept beside its output so an interrupted run can be resumed."""
CONTROL_VECTOR = "llama.cpp control vector"
"""A GGUF of the ``controlvector`` architecture: what ``bake --format llama-cpp`` writes."""
ADAPTER = "LoRA adapter"
"""A safetensors file with an adapter sidecar beside it (the same path with ``.json``): what ``tune`` writes."""

SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    (ARTIFACT, frozenset({"trait_name", "vectors"})),
    (CALIBRATION_STUDY, frozenset({"identity", "trials"})),
    (ADAPTER_SIDECAR, frozenset({"rank", "targets"})),
    (ACTIVATIONS, frozenset({"hidden_size", "records"})),
    ("workspace index", frozenset({"active", "entries"})),
    (PAIR_SET, frozenset({"pairs"})),
    (PROMPT_SET, frozenset({"prompts"})),
    ("example set", frozenset({"examples"})),
)
"""Kind → the top-level keys that mark it, most specific first; a pair set needs no trait_name."""

SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)
"""Things at a path that are not files: writing one would block, fail, or reach hardware."""


def with_article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def document_kind(raw: Any) -> str | None:
    """The kind of a parsed JSON document, from its distinguishing keys; None for anything else."""
    if not isinstance(raw, dict) or raw.get("product", "ster") != "ster":
        return None
    return next((kind for kind, keys in SIGNATURES if keys <= raw.keys()), None)


def file_kind(path: Path) -> str | None:
    """The kind of the JSON document in a file; None when it is not JSON or not one of Ster's."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
            if not head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):
                return None  # not a JSON object: a large binary file (a model's weights) is not read
            data = head + handle.read()
        return document_kind(json.loads(data.decode("utf-8-sig")))
    except (OSError, ValueError, RecursionError):
        return None


def adapter_sidecar_of(path: Path) -> Path:
    """Where the sidecar of an adapter file at ``path`` lies (the rule of :func:`ster.engine.model.adapters.artifact.sidecar_path`)."""
    return path.with_suffix(".json")


def _safetensors(path: Path, size: int) -> bool:
    """Whether a file begins as a safetensors file does: an 8-byte header length that fits, then a JSON object."""
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            return 0 < length <= size - 8 and handle.read(1) == b"{"
    except OSError:
        return False


def _control_vector(path: Path) -> bool:
    """Whether a file begins as a control-vector GGUF does: the magic, then its architecture key and value among
    the first metadata (llama.cpp's and Ster's writers put ``general.architecture`` first)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(512)
    except OSError:
        return False
    return head.startswith(b"GGUF") and b"general.architecture" in head and b"controlvector" in head


def special_file(mode: int) -> str | None:
    """ "a FIFO", "a socket" or "a device" for a mode that is one of those; None otherwise."""
    return next((name for test, name in SPECIAL if test(mode)), None)


@dataclass(frozen=True)
class Existing:
    """What lies at a path."""

    phrase: str
    """A few words for sentences: "a steering artifact", "a model directory", "a FIFO"."""
    file: bool = False
    """A regular file, which a write may replace (anything else it must not)."""
    kind: str | None = None
    """The kind of Ster document the file holds, when it holds one."""
    empty: bool = False
    """An empty file or directory: nothing would be lost by writing there."""
    directory: bool = False
    """A directory (a model directory included), which only a directory output may become when it is empty."""


def existing(path: Path) -> Existing | None:
    """What lies at ``path``, or None for nothing. A symlink is judged by what it points to (a
    dangling link is nothing: writing through it creates the file). Reads one file at most."""
    from ster.engine.protocol import confine

    try:
        # under a server's root the path is pinned with its links resolved: a link found there now
        # appeared since, and is judged as itself, never followed out of the root
        status = os.stat(path, follow_symlinks=not confine.active())
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Existing(f"something that cannot be read ({exc.strerror or exc})")
    if stat.S_ISLNK(status.st_mode):
        return Existing("a symbolic link that appeared after the job began")
    if stat.S_ISDIR(status.st_mode):
        return _directory(path)
    special = special_file(status.st_mode)
    if special is not None:
        return Existing(special)
    if status.st_size == 0:
        return Existing("an empty file", file=True, empty=True)
    kind = file_kind(path)
    if kind is None and _control_vector(path):
        kind = CONTROL_VECTOR
    if kind is None and _safetensors(path, status.st_size):
        side = adapter_sidecar_of(path)
        if side == path or file_kind(side) != ADAPTER_SIDECAR:
            return Existing("a safetensors file that is not a LoRA adapter (no adapter sidecar beside it)", file=True)
        kind = ADAPTER
    return Existing(with_article(kind) if kind else "a file that is not a Ster document", file=True, kind=kind)


def describe_existing(path: Path) -> str | None:
    """What lies at ``path`` as a phrase ("a steering artifact", "a model directory"), or None for nothing.

    Imports no torch, so the terminal app can ask before it replaces a file.
    """
    found = existing(path)
    return found.phrase if found else None


def _directory(path: Path) -> Existing:
    if (path / "config.json").is_file():
        return Existing("a model directory", directory=True)
    try:
        empty = not any(path.iterdir())
    except OSError:
        empty = False
    return Existing("an empty directory" if empty else "a directory", empty=empty, directory=True)
