"""A real HTTP server on 127.0.0.1 standing in for the Brama gateway, shared by the tests that need one."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, Any]], tuple[int, str]]


@contextmanager
def serving(answer: Answer, requests: list[dict[str, Any]]) -> Iterator[str]:
    """Serve ``POST /v1/chat/completions``: record each request, reply with ``answer(body)``; yield the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            status, text = answer(body)
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def completion(text: str) -> str:
    """A successful chat-completion body carrying ``text``."""
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
