"""``ster serve``: bind, say ``{"port":N,"ready":true}`` once connections are accepted, serve until stopped.

The socket is bound here, before uvicorn starts, so a port that is taken is refused in one
sentence (``failed to bind the serve port``) and port 0 takes a free one the ready line names.
SIGINT or SIGTERM stops the server: every job in flight is cancelled (each stops at its next
unit of work, its output never written), their streams end with their last event, and the
process exits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from ster.engine.protocol.errors import ExitCode
from ster.serve.guard import TOKEN_ENV, Root, check_strength, is_loopback, read_token
from ster.serve.wire import WireRefusal

SHUTDOWN_GRACE = 15
"""Seconds a stopping server waits for cancelled jobs to end their streams."""


def _refuse(sentence: str) -> int:
    sys.stderr.write(f"error: {sentence}\n")
    sys.stderr.flush()
    return int(ExitCode.REFUSED)


def _port(text: str) -> int | None:
    value = text.strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) <= 65535 else None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    host: str, port_text: str | int, token_file: str | None, root_dir: str | None, models: list[str] | None = None
) -> int:
    """Run the server; returns the exit status."""
    port = _port(str(port_text))
    if port is None:
        return _refuse(f'--port must be a whole number from 0 to 65535; got "{str(port_text)[:40]}"')
    try:
        token = read_token(token_file)
        if token is not None:
            check_strength(token)
        root = Root(root_dir) if root_dir is not None else None
    except WireRefusal as exc:
        return _refuse(str(exc))
    if not is_loopback(host):
        if token is None:
            return _refuse(
                f"serving on {host}, which is not a loopback address, requires a bearer token: give "
                f"--token-file FILE or set {TOKEN_ENV}"
            )
        if root is None:
            return _refuse(
                f"serving on {host}, which is not a loopback address, requires --root DIR to confine "
                f"the paths requests name"
            )
    try:
        sock = _bind(host, port)
    except (OSError, OverflowError) as exc:
        return _refuse(f"failed to bind the serve port: {getattr(exc, 'strerror', None) or exc}")
    if root is not None:
        os.chdir(root.path)  # relative paths in requests are taken from the root
    from ster.serve.app import create_app
    from ster.serve.openai import OpenAIError

    app = create_app(token=token, root=root)
    for name in models or []:
        try:
            app.state.served.load(name, requested=False)  # on the model thread
        except OpenAIError as exc:
            sock.close()
            return _refuse(f"--model {name}: {exc.message}")
    return _run(sock, app)


def _run(sock: socket.socket, app: Any) -> int:
    import uvicorn

    from ster.serve import limits

    jobs, served = app.state.jobs, app.state.served
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        server_header=False,
        http=limits.protocol(),
        timeout_keep_alive=int(limits.IDLE_TIMEOUT),
    )
    config.load()  # uvicorn's own logging set up now, so the one-line filters sit on its loggers
    limits.quiet_logging()

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                sys.stdout.write(
                    json.dumps({"port": sock.getsockname()[1], "ready": True}, separators=(",", ":")) + "\n"
                )
                sys.stdout.flush()

        async def shutdown(self, sockets: Any = None) -> None:
            jobs.cancel_all()
            served.close()
            await super().shutdown(sockets=sockets)

    Server(config).run(sockets=[sock])
    return int(ExitCode.OK)
