"""What keeps ``ster serve`` safe off loopback: a bearer token and a root that confines every path.

* **Loopback only by default.** A host other than a loopback address is refused unless the server
  has a token (``--token-file`` or ``STER_SERVE_TOKEN``) and a ``--root`` directory.
* **The token** is read once at start, compared in constant time (:func:`hmac.compare_digest`) with
  the ``Authorization: Bearer …`` header of every request but ``GET /v1/health``, and never logged
  or echoed: a wrong or missing one gets 401 and a sentence that does not contain it.
* **The root** confines every path a request names: its path fields and its model directory. A
  relative path is taken from the root (the server runs there); an absolute path outside it, a
  ``..`` that leaves it, and a symlink whose target lies outside it are each refused in one
  sentence before the job starts. Bundled names (``ster:toy``, ``ster:pairs``) stay readable.

Nothing here imports torch.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ster.engine.protocol.paths import DATA_DIR, PREFIX, flag, is_path_field
from ster.serve.wire import WireRefusal

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


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``, compared in constant time."""
    given = (header or "").removeprefix("Bearer ").strip() if (header or "").startswith("Bearer ") else ""
    return hmac.compare_digest(given.encode(), token.encode())


class Root:
    """A directory every path of a request must stay inside."""

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise WireRefusal(f"--root {directory} is not a directory")
        self.path = path.resolve()

    def inside(self, value: str | Path) -> bool:
        real = Path(os.path.realpath(self.path / Path(value).expanduser()))
        return real == self.path or real.is_relative_to(self.path)

    def check(self, fields: dict[str, Any], request: BaseModel) -> None:
        """Refuse the first path field (or model directory) that leads outside the root."""
        for name, info in type(request).model_fields.items():
            raw = fields.get(name)
            if raw is None or (not is_path_field(info.annotation) and name != "model"):
                continue
            text = str(raw)
            if text.startswith(PREFIX):
                continue  # a bundled name, resolved inside Ster's own read-only data
            value = getattr(request, name)
            if isinstance(value, Path) and Path(os.path.realpath(value)).is_relative_to(DATA_DIR.resolve()):
                if name not in getattr(type(request), "outputs", ()):
                    continue
            if not self.inside(text):
                raise WireRefusal(f"{flag(name)} {text} leads outside the server's root {self.path}; "
                                  f"name a path inside it")
            if name == "model" and not (self.path / text).is_dir():
                raise WireRefusal(f"--model {text} is not a checkpoint directory inside the server's root "
                                  f"{self.path}; with --root a model is a directory inside it or a bundled ster: name")
