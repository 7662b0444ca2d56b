"""Keeping every path a job opens inside a root directory: what ``ster serve --root`` promises.

Under a root, a path is resolved when the job opens it, by walking it one component at a time
from a descriptor of the root, never by handing the whole string to the system:

* ``..`` that would climb above the root, an absolute path elsewhere, and a symbolic link, at any
  component, whose target lies outside are refused as soon as the walk meets them, before anything
  outside is looked at, so the sentence is the same whether or not the path exists out there;
* what the walk reaches is **pinned**. A file is held open and read through ``/proc/self/fd``,
  by the job and by the libraries it hands a path to (tokenizers, safetensors, transformers), so a
  link swapped in after the walk cannot redirect the read. A directory that is read (a model, a
  PEFT adapter) becomes a private directory of pinned files, each walked like any other path, so
  a file inside it that links out is refused too. An output's directory is held open and the
  write's temporary and its rename happen inside it, through the descriptor, so a link swapped in
  while the job waits in the queue or runs cannot send the write elsewhere;
* a path is pinned once per job, at its first use: the check before the work and the write after
  it see the same place.

The places Ster keeps for itself (the bundled data, the workspace and the first-use state) are
not the client's and are read and written where they are; a client's path into them is still
refused, because the server checks every path a request names (:meth:`Root.check`) before the job
is queued, and these checks see only the root.

Without a root (the command line, the terminal app, a server started without ``--root``) every
function here gives its path back unchanged. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ster.engine.protocol import inflight
from ster.engine.protocol.errors import Refusal

_PATH = getattr(os, "O_PATH", 0)
"""Open for walking only: no read permission needed, a FIFO never blocks (Linux). Elsewhere 0."""
_PINNABLE = bool(_PATH) and sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")
"""Whether a descriptor can be handed on as a path (``/proc/self/fd/N``). Elsewhere paths are
walked and checked the same way, and the walked path is handed on (a narrow window remains)."""
MAX_LINKS = 40
"""Symbolic links one walk follows before it gives up, as the kernel does."""


class Outside(Refusal):
    """A path that leads outside the root."""


@dataclass
class Walked:
    """Where a walk ended: the directory it reached, the last component, and what it is."""

    directory: int
    """A descriptor of the directory that holds the last component, or of the deepest one that exists
    (owned by the caller)."""
    missing: tuple[str, ...]
    """Components below ``directory`` that do not exist, the last one included (empty when it exists)."""
    name: str
    """The last component, '' when the path is the root itself."""
    fd: int | None
    """A descriptor of what the path names when it exists (owned by the caller)."""
    mode: int
    relative: tuple[str, ...]
    """The path inside the root with every link resolved."""
    linked: bool = False
    """Whether the path's own last component was a link (so ``directory`` may be another one's)."""


def _collapse(parts: list[str]) -> list[str]:
    """``a/../b`` → ``b`` for components that do not exist (so cannot be links); leading ``..`` stay."""
    out: list[str] = []
    for part in parts:
        if part == ".." and out and out[-1] != "..":
            out.pop()
        else:
            out.append(part)
    return out


class Root:
    """A directory every path a job names must stay inside."""

    def __init__(self, directory: str | Path) -> None:
        given = Path(directory).expanduser()
        if not given.is_dir():
            raise Refusal(f"--root {directory} is not a directory")
        self.path = given.resolve()
        self._spellings = sorted({str(self.path), os.path.abspath(given)}, key=len, reverse=True)
        self.fd = os.open(self.path, _DIRECTORY)

    def outside(self, shown: str | Path) -> Outside:
        return Outside(f"{shown} leads outside the server's root {self.path}; name a path inside it")

    def parts(self, value: str | Path, shown: str) -> list[str]:
        """The components of ``value`` below the root; an absolute path elsewhere is refused."""
        text = os.path.expanduser(os.fspath(value))
        if os.path.isabs(text):
            for spelling in self._spellings:
                if text == spelling or text.startswith(spelling.rstrip("/") + "/"):
                    text = text[len(spelling) :]
                    break
            else:
                raise self.outside(shown)
        return [part for part in text.split("/") if part not in ("", ".")]

    def walk(
        self, value: str | Path, shown: str | None = None, start: tuple[int, tuple[str, ...]] | None = None
    ) -> Walked:
        """Walk ``value`` from the root, following every link that stays inside it.

        A component that does not exist ends the walk: it and the rest are ``missing``. ``shown``
        is how a refusal names the path (default: as given). ``start`` walks a relative ``value``
        from a directory held already (its descriptor and its path inside the root) instead, and
        refuses a ``..`` above it.
        """
        shown = shown if shown is not None else os.fspath(value)
        if start is None:
            queue = self.parts(value, shown)
            stack, names = [os.dup(self.fd)], []
        else:
            queue = [part for part in os.fspath(value).split("/") if part not in ("", ".")]
            stack, names = [os.dup(start[0])], list(start[1])
        links, linked = 0, False
        try:
            while queue:
                name = queue.pop(0)
                if name == "..":
                    if len(stack) == 1:
                        raise self.outside(shown)
                    os.close(stack.pop())
                    names.pop()
                    continue
                fd, mode = _open_component(name, stack[-1])
                if fd is None:
                    rest = _collapse([name, *queue])
                    if rest and rest[0] == name:
                        return _ended(stack, names, tuple(rest), None, 0, linked=linked)
                    queue = rest  # the missing name was climbed back out of
                    continue
                if stat.S_ISLNK(mode):
                    os.close(fd)
                    linked = linked or not queue
                    links += 1
                    if links > MAX_LINKS:
                        raise Refusal(f"{shown} has too many levels of symbolic links")
                    target = os.readlink(name, dir_fd=stack[-1])
                    if os.path.isabs(target):
                        try:
                            spliced = self.parts(target, shown)
                        except Outside:
                            raise self.outside(shown) from None
                        while len(stack) > 1:
                            os.close(stack.pop())
                        names.clear()
                        queue = spliced + queue
                    else:
                        queue = [p for p in target.split("/") if p not in ("", ".")] + queue
                    continue
                if not queue:
                    return _ended(stack, names, (), fd, mode, name, linked)
                if not stat.S_ISDIR(mode):  # a file where a directory was needed: nothing exists below it
                    os.close(fd)
                    return _ended(stack, names, (name, *queue), None, 0)
                stack.append(fd)
                names.append(name)
            if len(stack) == 1:  # the root itself, or the held directory the walk started in
                relative = tuple(names)
                return Walked(stack[0], (), relative[-1] if relative else "", os.dup(stack[0]), stat.S_IFDIR, relative)
            fd, name = stack.pop(), names.pop()  # a directory climbed back to with ..
            return _ended(stack, names, (), fd, stat.S_IFDIR, name)
        except BaseException:
            for each in stack:
                os.close(each)
            raise

    def check(self, value: str | Path, shown: str | None = None) -> bool:
        """Refuse ``value`` if it leads outside the root; True when it names something that exists."""
        walked = self.walk(value, shown)
        _close(walked)
        return walked.fd is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_DIRECTORY = (_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_COMPONENT = (_PATH or os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_component(name: str, directory: int) -> tuple[int | None, int]:
    """A descriptor of ``name`` in ``directory`` and its mode, the link itself if it is one; (None, 0) if absent."""
    try:
        fd = os.open(name, _COMPONENT, dir_fd=directory)
    except FileNotFoundError:
        return None, 0
    except OSError as exc:
        if exc.errno != errno.ELOOP or _PATH:
            raise
        # without O_PATH a link cannot be opened itself: hold its directory again in its place
        return os.dup(directory), os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    return fd, os.fstat(fd).st_mode


def _ended(
    stack: list[int],
    names: list[str],
    missing: tuple[str, ...],
    fd: int | None,
    mode: int,
    name: str | None = None,
    linked: bool = False,
) -> Walked:
    """Keep the descriptor of the directory the walk ended in; close the rest of the stack."""
    keep = stack.pop()
    for each in stack:
        os.close(each)
    last = missing[-1] if missing else (name or "")
    relative = (*names, *missing) if missing else (*names, last)
    return Walked(keep, missing, last, fd, mode, relative, linked)


def _close(walked: Walked) -> None:
    for fd in (walked.directory, walked.fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


@dataclass
class _Job:
    """One job's confinement: the root, what it pinned, and its private directory of pinned files."""

    root: Root
    held: list[int] = field(default_factory=list)
    directories: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Held directories by descriptor, with their paths inside the root: a path the job builds below
    one (``/proc/self/fd/N/...``, a staging directory's files) is walked from it."""
    reads: dict[str, Path] = field(default_factory=dict)
    writes: dict[str, _Output] = field(default_factory=dict)
    write_dirs: dict[str, int] = field(default_factory=dict)
    """The directory of each output pinned so far, by the output's directory as given."""
    shadow: Path | None = None
    count: int = 0
    names: dict[str, str] = field(default_factory=dict)
    """Pinned path → the path as the job was given it, so its sentences never show a pin."""

    def hold(self, fd: int) -> int:
        self.held.append(fd)
        return fd

    def private(self, name: str) -> Path:
        """A new empty directory of this job's own, to place pinned files in under their own names."""
        if self.shadow is None:
            # held like any temporary of Ster's (locked while the job lives), so a server killed outright
            # leaves it to be reclaimed by the next confined job rather than forever
            self.shadow = Path(
                inflight.temp_directory(prefix=".ster-root.", suffix=inflight.SUFFIX, dir=tempfile.gettempdir())
            )
        self.count += 1
        place = self.shadow / str(self.count)
        place.mkdir()
        return place

    def close(self) -> None:
        for fd in self.held:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held.clear()
        if self.shadow is not None:
            shutil.rmtree(self.shadow, ignore_errors=True)
            inflight.unregister(self.shadow)


@dataclass
class _Output:
    """Where a write goes: a held directory, the components still to be made below it, and the name."""

    directory: int
    missing: tuple[str, ...]
    name: str
    relative: tuple[str, ...]
    placeholder: Path | None = None
    """What a check sees while the directories are not made yet: a private path that does not exist."""


_current: ContextVar[_Job | None] = ContextVar("ster_confinement", default=None)


@contextlib.contextmanager
def within(root: Root | None) -> Iterator[None]:
    """Confine the paths the code inside opens to ``root`` (nothing changes for None)."""
    if root is None:
        yield
        return
    job = _Job(root)
    token = _current.set(job)
    try:
        yield
    finally:
        _current.reset(token)
        job.close()


def active() -> bool:
    """Whether the running job is confined to a root."""
    return _current.get() is not None


def _own(path: Path) -> bool:
    """Whether ``path`` lies in a place Ster keeps for itself (bundled data, workspace, first-use state)."""
    from ster.engine.protocol.paths import DATA_DIR

    text = os.fspath(path)
    if not os.path.isabs(text) or ".." in text.split("/"):
        return False  # Ster names its own places by absolute paths that never climb
    text = os.path.abspath(text)
    places = [DATA_DIR, _xdg("XDG_DATA_HOME", ".local/share"), _xdg("XDG_STATE_HOME", ".local/state")]
    for place in places:
        for spelling in {os.path.abspath(place), os.path.realpath(place)}:
            if text == spelling or text.startswith(spelling + "/"):
                return True
    return False


def _xdg(variable: str, fallback: str) -> Path:
    base = os.environ.get(variable)
    return (Path(base) if base else Path.home() / fallback) / "ster"


def _route(job: _Job, path: Path) -> tuple[str, tuple[int, tuple[str, ...]] | None, str]:
    """How a path is reached under a root: ("own", …) for Ster's own places and the job's own pins,
    else ("walk", start, rest) with the directory to walk from (None: the root)."""
    text = os.fspath(path)
    if _own(path) or (job.shadow is not None and text.startswith(str(job.shadow) + "/")):
        return "own", None, text
    if text.startswith("/proc/self/fd/"):
        head, _, rest = text.removeprefix("/proc/self/fd/").partition("/")
        if head.isdigit() and int(head) in job.directories:
            return "walk", (int(head), job.directories[int(head)]), rest
    return "walk", None, text


def readable(path: Path) -> Path:
    """The path to read ``path`` through: itself without a root; else a pinned copy of the name.

    Under a root, a file that exists becomes a link, in the job's private directory, to its
    descriptor; a directory becomes a private directory of such links, one per file in it; a path
    that does not exist becomes a private path that does not exist either, so the caller's own
    check says so. A link out of the root, anywhere on the way, is refused.
    """
    job = _current.get()
    if job is None:
        return path
    how, start, rest = _route(job, path)
    if how == "own":
        return path
    key = os.path.abspath(os.fspath(path))
    if key not in job.reads:
        job.reads[key] = _pin_read(job, path, start, rest)
        job.names[str(job.reads[key])] = _shown(job, path)
    return job.reads[key]


def _pin_read(job: _Job, path: Path, start: tuple[int, tuple[str, ...]] | None, rest: str) -> Path:
    walked = job.root.walk(rest, str(path), start)
    os.close(walked.directory)
    name = walked.name or "root"
    place = job.private(name)
    if walked.fd is None:
        return place / name  # nothing there: a private path that does not exist, named as given
    job.hold(walked.fd)
    if not stat.S_ISDIR(walked.mode):
        return _link(place / name, walked.fd, job.root.path.joinpath(*walked.relative))
    directory = place / name
    directory.mkdir()
    listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=walked.fd)
    try:
        entries = sorted(os.listdir(listing))
    finally:
        os.close(listing)
    for entry in entries:
        inner = job.root.walk(Path(*walked.relative, entry), f"{path}/{entry}")
        os.close(inner.directory)
        if inner.fd is None:
            continue  # a link to nothing: as absent as it would be anywhere
        if stat.S_ISDIR(inner.mode):
            os.close(inner.fd)
            continue  # only a directory's own files are read (a checkpoint's, an adapter's)
        job.hold(inner.fd)
        _link(directory / entry, inner.fd, job.root.path.joinpath(*inner.relative))
    return directory


def _link(place: Path, fd: int, walked: Path) -> Path:
    os.symlink(_fd_path(fd) if _PINNABLE else walked, place)
    return place


def writable(path: Path, make: bool = True) -> Path:
    """The path a write to ``path`` goes to: without a root, the target of a link or the path itself;
    under a root, ``path`` pinned inside it. ``make`` makes its missing directories.

    Under a root the write goes through a descriptor of the destination's directory, and a link that
    appears at the last component after the pin is replaced, never followed. Before its directories
    exist (``make`` false), the path is a private one that does not exist.
    """
    job = _current.get()
    if job is None or _route(job, path)[0] == "own":
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        if make:
            target.parent.mkdir(parents=True, exist_ok=True)
        return target
    out = _output(job, path)
    if out.missing and make:
        out.directory, out.missing = _make(job, out), ()
    if out.missing:
        if out.placeholder is None:
            out.placeholder = job.private(out.name) / out.name
            job.names[str(out.placeholder)] = _shown(job, path)
        return out.placeholder
    if not _PINNABLE:
        return job.root.path.joinpath(*out.relative)
    return Path(_fd_path(out.directory), out.name)


def _output(job: _Job, path: Path) -> _Output:
    key = os.path.abspath(os.fspath(path))
    if key not in job.writes:
        _, start, rest = _route(job, path)
        if start is not None and not rest.strip("/"):
            raise Refusal(f"{_shown(job, path)} is a directory the job holds, not a file inside it")
        sibling = job.write_dirs.get(os.path.dirname(key))
        if start is None and sibling is not None and os.path.basename(key) not in ("", ".", ".."):
            # beside an output pinned already (a sidecar, a checkpoint): in the same pinned directory
            start, rest = (sibling, job.directories[sibling]), os.path.basename(key)
        walked = job.root.walk(rest, str(path), start)
        if walked.fd is not None:
            os.close(walked.fd)
        if not walked.name:
            os.close(walked.directory)
            raise Refusal(f"{path} is the server's root, not a file inside it")
        out = _Output(job.hold(walked.directory), walked.missing[:-1], walked.name, walked.relative)
        job.directories[out.directory] = walked.relative[: len(walked.relative) - max(len(walked.missing), 1)]
        job.names[_fd_path(out.directory)] = "/".join(job.directories[out.directory]) or "."
        if not out.missing and not walked.linked:
            job.write_dirs.setdefault(os.path.dirname(key), out.directory)
        job.writes[key] = out
    return job.writes[key]


def _make(job: _Job, out: _Output) -> int:
    """Make the missing directories of an output below its held directory, following no link."""
    fd, relative = out.directory, job.directories[out.directory]
    for name in out.missing:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=fd)
        fd = job.hold(os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd))
        relative = (*relative, name)
        job.directories[fd] = relative
        job.names[_fd_path(fd)] = "/".join(relative)
    return fd


def directory_of_write(path: Path) -> Path | None:
    """Under a root, the existing directory a write to ``path`` goes through (where a check that it can
    hold a new file probes); None without a root, where the caller walks up the path itself."""
    job = _current.get()
    if job is None or _route(job, path)[0] == "own":
        return None
    out = _output(job, path)
    return (
        Path(_fd_path(out.directory)) if _PINNABLE else job.root.path.joinpath(*out.relative[: -1 - len(out.missing)])
    )


def _shown(job: _Job, path: Path) -> str:
    """How a sentence names ``path``: as given, with any pin in it named as its own path was given."""
    return _unpinned(job, os.fspath(path))


def _unpinned(job: _Job, text: str) -> str:
    pattern = "|".join(re.escape(pinned) for pinned in sorted(job.names, key=len, reverse=True))
    return re.sub(f"({pattern})(?![\\w.-])", lambda found: job.names[found.group(1)], text) if pattern else text


def shown(event: Any) -> Any:
    """An event of a confined job with every pinned path in its sentences (and its result) named as the
    job was given it; unchanged outside a confined job."""
    job = _current.get()
    if job is None or not job.names:
        return event
    update: dict[str, Any] = {}
    for name in ("message", "data"):
        value = getattr(event, name, None)
        if value is not None:
            update[name] = _rewrite(job, value)
    return event.model_copy(update=update) if update else event


def _rewrite(job: _Job, value: Any) -> Any:
    if isinstance(value, str):
        return _unpinned(job, value) if ("/proc/self/fd/" in value or ".ster-root." in value) else value
    if isinstance(value, list):
        return [_rewrite(job, item) for item in value]
    if isinstance(value, dict):
        return {key: _rewrite(job, item) for key, item in value.items()}
    return value


def held_directory(path: Path) -> Path:
    """A directory the job just made (a staging directory), as a path through a descriptor of it, so that
    what is written inside it cannot be sent elsewhere by a link swapped in for it; itself without a root."""
    job = _current.get()
    if job is None or not _PINNABLE:
        return path
    how, start, rest = _route(job, path)
    if how == "own" or start is None or "/" in rest:
        return path
    fd = job.hold(os.open(rest, _DIRECTORY | os.O_NOFOLLOW, dir_fd=start[0]))
    job.directories[fd] = (*start[1], rest)
    job.names[_fd_path(fd)] = "/".join(job.directories[fd])
    return Path(_fd_path(fd))
