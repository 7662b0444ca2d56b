"""The one hosted call Ster makes: a chat completion through the Brama gateway, for pair synthesis.

Ster holds no provider credential and speaks no provider API. It reads Brama's own
client variables from its environment — ``BRAMA_URL`` (default
``https://brama.wisent.com``) and ``BRAMA_BEARER`` — and sends exactly ``model``,
``messages`` (one user message), ``max_tokens`` and ``temperature``, because the
gateway refuses unknown fields by name. Everything is checked before the first
request, in the gateway's own words where it has them. The bearer never appears in
an event, an error or a report.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ster.engine.protocol.errors import Refusal

DEFAULT_URL = "https://brama.wisent.com"
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_ROUTE = re.compile(rf"^{_SEGMENT}(/{_SEGMENT})+$")
_SELECTOR = re.compile(r"^(any|best|task:[A-Za-z0-9._-]+)$")
SIGNED_ONLY_WARNING = (
    "best and the any/task: selectors need an agent-signed request, which Ster does not send; "
    "expect the gateway to refuse it and use a declared alias or a provider/model route"
)


def check_route(route: str) -> bool:
    """Refuse a route outside Brama's vocabulary; return True when it needs an agent-signed request."""
    if _SELECTOR.match(route):
        return True
    if _ROUTE.match(route):
        return False
    raise Refusal("the generator model must be a Brama alias, a canonical provider/model route, or a selector")


def check_bounds(max_tokens: int, temperature: float) -> None:
    """Brama's two documented bounds, checked here to save a round trip per pair."""
    if not 1 <= max_tokens <= 32768:
        raise Refusal("max_tokens must be between one and 32768")
    if not math.isfinite(temperature) or not 0 <= temperature <= 2:
        raise Refusal("temperature must be finite and between zero and 2")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class BramaClient:
    """A configured gateway client; build it with :meth:`from_environment`."""

    base: str
    bearer: str
    timeout: float = 120.0

    @classmethod
    def from_environment(cls) -> BramaClient:
        """Read and check BRAMA_URL and BRAMA_BEARER, refusing before any request."""
        base = os.environ.get("BRAMA_URL") or DEFAULT_URL
        parts = urlsplit(base)
        secure = parts.scheme == "https" and bool(parts.hostname)
        if not secure and not (parts.scheme == "http" and _loopback(parts.hostname or "")):
            raise Refusal(
                "BRAMA_URL must be an https:// base or an explicit http:// loopback address, because "
                "Brama answers plain http elsewhere with 426 secure_transport_required"
            )
        bearer = os.environ.get("BRAMA_BEARER", "").strip()
        if not bearer:
            raise Refusal("BRAMA_BEARER is unset or empty; export Ster's own Brama bearer before running this command")
        return cls(base.rstrip("/"), bearer)

    def __repr__(self) -> str:  # keeps the bearer out of any log that prints the client
        return f"BramaClient(base={self.base!r})"

    def complete(self, route: str, prompt: str, max_tokens: int, temperature: float) -> str:
        """One chat completion: the text of ``choices[0].message.content``."""
        import httpx

        body = {
            "model": route,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        try:
            response = httpx.post(
                f"{self.base}/v1/chat/completions",
                json=body,
                timeout=self.timeout,
                headers={"Authorization": f"Bearer {self.bearer}"},
            )
        except httpx.HTTPError as exc:
            raise Refusal(f"brama at {self.base} could not be reached: {self._scrub(str(exc))}") from None
        if response.status_code != 200:
            raise self._refusal(response.status_code, response.text)
        return self._content(response)

    def _content(self, response: Any) -> str:
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise Refusal("brama answered 200 without a completion in choices[0].message.content")
        return content

    def _refusal(self, status: int, text: str) -> Refusal:
        """Brama's error envelope in its own words, or the body excerpt when there is no envelope."""
        try:
            envelope = _envelope(text)
        except ValueError:
            excerpt = self._scrub(" ".join(text.split()))[:200]
            return Refusal(
                f"brama refused the completion with {status} and a body that is not its error envelope: {excerpt}",
                {"status": status},
            )
        details = {"status": status, **{k: envelope.get(k) for k in ("type", "code", "retryable", "attempts")}}
        return Refusal(f"brama refused the completion: {status} {self._scrub(str(envelope['message']))}", details)

    def _scrub(self, text: str) -> str:
        return text.replace(self.bearer, "[bearer]")


def _envelope(text: str) -> dict[str, Any]:
    """The ``error`` object of Brama's ``{"error": {...}}`` envelope; ValueError when the body is not one."""
    import json

    document = json.loads(text)
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise ValueError("not an error envelope")
    return error
