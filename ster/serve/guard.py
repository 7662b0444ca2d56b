"""What keeps ``ster serve`` safe off loopback: a bearer token and a root that confines every path.

* **Loopback only by default.** A host other than a loopback address is refused unless the server
  has a token (``--token-file`` or ``STER_SERVE_TOKEN``) and a ``--root`` directory.
* **The token** is read once at start, compared in constant time (:func:`hmac.compare_digest`) with
  the ``Authorization: Bearer …`` header of every request but ``GET /v1/health``, and never logged
  or echoed: a wrong or missing one gets 401 and a sentence that does not contain it.
* **The root** confines every path a request names: its path fields and its model directory. A
  relative path is taken from the root (the server runs there); an absolute path outside it, a
  ``..`` that leaves it, and a symlink whose target lies outside it are each refused in one
  sentence before the request is queued (:meth:`Root.check_fields`), and every path the job then
  opens is walked inside the root again when it is opened (:mod:`ster.engine.protocol.confine`).
  Bundled names (``ster:toy``, ``ster:pairs``) are a fixed list, matched exactly.

Nothing here imports torch.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from pathlib import Path
from typing import Any

from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import request_class
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import EXAMPLES, is_path_field
from ster.serve.wire import WireRefusal

RESERVED_MODELS = frozenset({"ster:toy", "ster:toy-chat"})
"""The bundled models' names (:data:`ster.engine.model.resolve.RESERVED`, which imports the model part)."""

TOKEN_ENV = "STER_SERVE_TOKEN"
"""The environment variable a server reads its token from when no ``--token-file`` is given."""
CLIENT_TOKEN_ENV = "STER_TOKEN"
"""The environment variable ``ster --server`` reads its token from when no ``--token-file`` is given."""
UNAUTHORIZED = "this server requires a bearer token; send the right one in an Authorization: Bearer header"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: str | None, env: str = TOKEN_ENV) -> str | None:
    """The token from a file (its first line, stripped) or else from the environment; None without either.

    A file that cannot be read, or that holds no token, is refused in one sentence that names the
    file and never its content.
    """
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WireRefusal(f"cannot read the token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise WireRefusal(f"the token file {path} is empty")
        return token
    token = os.environ.get(env, "").strip()
    return token or None


MIN_TOKEN_LENGTH = 32
"""The fewest characters a server's token may have: 32 hexadecimal digits are 128 bits."""
MIN_TOKEN_KINDS = 8
"""The fewest different characters it may have, so a long run of one character is no token either."""


def check_strength(token: str) -> None:
    """Refuse a token a client could guess, in one sentence that never shows it: a token that is given is
    enforced, on loopback too, so it must be strong wherever it is."""
    length, kinds = len(token), len(set(token))
    if length < MIN_TOKEN_LENGTH or kinds < MIN_TOKEN_KINDS:
        raise WireRefusal(
            f"the bearer token is too weak to guard a server ({length} characters, {kinds} different); "
            f"give one of at least {MIN_TOKEN_LENGTH} characters with at least {MIN_TOKEN_KINDS} "
            "different ones, such as the output of openssl rand -hex 32"
        )


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``, compared in constant time."""
    given = (header or "").removeprefix("Bearer ").strip() if (header or "").startswith("Bearer ") else ""
    return hmac.compare_digest(given.encode(), token.encode())


class Root(confine.Root):
    """The server's root: :class:`ster.engine.protocol.confine.Root` (which every job of the server runs
    under), with the check of a request's paths that runs before the request is built or queued."""

    def __init__(self, directory: str | Path) -> None:
        try:
            super().__init__(directory)
        except Refusal as exc:
            raise WireRefusal(str(exc)) from None

    def check_fields(self, job: str, fields: dict[str, Any]) -> None:
        """Refuse the first path a request names (in field order) that leads outside the root.

        Runs on the body's values before anything else looks at them, so no check touches a path
        outside the root, and a sentence never depends on what exists there. A bundled name is one
        of a fixed list, matched exactly; any other value is a path.
        """
        kind = request_class(job)
        for name, info in kind.model_fields.items():
            raw = fields.get(name)
            if not isinstance(raw, str | os.PathLike) or not os.fspath(raw).strip():
                continue  # absent, blank (none) or not text: the request model says what is wrong
            text = os.fspath(raw)
            if name == "model" or (name == "judge" and text != "none"):  # a judge is a model too
                self.check_model(text, flag(name))
            elif (name == "reward" and text != "length") or is_path_field(info.annotation):
                if text in EXAMPLES and name not in getattr(kind, "outputs", ()):
                    continue  # a bundled example, read from Ster's own read-only data
                self.check_inside(text, flag(name))

    def check_inside(self, text: str, what: str) -> confine.Walked:
        try:
            walked = self.walk(text, f"{what} {text}")
        except Refusal as exc:
            raise WireRefusal(str(exc)) from None
        for fd in (walked.directory, walked.fd):
            if fd is not None:
                os.close(fd)
        return walked

    def check_model(self, text: str, what: str = "--model") -> None:
        if text in RESERVED_MODELS:
            return
        walked = self.check_inside(text, what)
        if walked.fd is None or not stat.S_ISDIR(walked.mode):
            raise WireRefusal(
                f"{what} {text} is not a checkpoint directory inside the server's root "
                f"{self.path}; with --root a model is a directory inside it or a bundled ster: name"
            )
