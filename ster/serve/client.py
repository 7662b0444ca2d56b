"""Running jobs on a ``ster serve`` server: what ``ster --server URL`` and ``ster tui --server URL`` use.

:meth:`Remote.run_job` has the shape of :func:`ster.engine.protocol.jobs.run_job`: it sends the
job's fields to ``POST /v1/<operation>?stream=events``, emits every event the server streams (the
same events a local engine emits, token events included) and returns the final one. The fields
go as given, unvalidated here: paths name files on the server, which checks them. Cancelling sets
the server's cancel flag through ``POST /v1/jobs/<id>/cancel`` and keeps reading, so the last
event is the server's own account of what happened; the job stops at its next unit of work.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ster.engine.protocol.events import Error, Outcome, parse_event
from ster.engine.protocol.paths import EXAMPLES, EXAMPLES_DIR
from ster.serve.wire import WireRefusal

_BUNDLED = {str((EXAMPLES_DIR / file).resolve()): name for name, file in EXAMPLES.items()}


def jsonable(value: Any) -> Any:
    """A field's value as JSON: paths as text (a bundled example by its ``ster:`` name), models as objects."""
    if isinstance(value, Path):
        text = str(value)
        return _BUNDLED.get(str(value.resolve()) if value.is_absolute() else text, text)
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


class Remote:
    """A Ster server, by its base URL, and the token it wants (if any)."""

    def __init__(self, url: str, token: str | None = None, connect_timeout: float = 10.0) -> None:
        check_url(url)
        self.url = url.rstrip("/")
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.connect_timeout = connect_timeout

    def _client(self) -> Any:
        import httpx

        return httpx.Client(
            base_url=self.url, headers=self.headers, timeout=httpx.Timeout(self.connect_timeout, read=None)
        )

    def run_job(
        self, name: str, fields: dict[str, Any], emit: Any, cancel: threading.Event | None = None, models: Any = None
    ) -> Outcome:
        """Run job ``name`` on the server, emitting its events; return the final one (also emitted)."""
        import httpx

        cancel = cancel or threading.Event()
        body = {key: jsonable(value) for key, value in fields.items() if value is not None}
        started, finished = threading.Event(), threading.Event()
        try:
            with self._client() as client:
                final = self._stream(client, name, body, emit, cancel, started, finished)
        except NotSter as exc:
            final = Error(kind="refused" if not started.is_set() or exc.first else "internal", message=str(exc))
            emit(final)
        except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:
            final = Error(kind="refused", message=f"cannot reach the Ster server at {self.url}: {_reason(exc)}")
            if started.is_set():  # the stream had started: the connection broke in the middle of the job
                final = Error(
                    kind="internal",
                    message=f"the connection to the Ster server at {self.url} broke "
                    f"before the job ended: {_reason(exc)}",
                )
            emit(final)
        finally:
            finished.set()
        return final

    def _stream(
        self,
        client: Any,
        name: str,
        body: dict[str, Any],
        emit: Any,
        cancel: threading.Event,
        started: threading.Event,
        finished: threading.Event,
    ) -> Outcome:
        operation = name.replace(" ", "/")
        with client.stream("POST", f"/v1/{operation}", params={"stream": "events"}, json=body) as response:
            if response.status_code != 200:
                final = self._refused(name, response)
                emit(final)
                return final
            job_id = response.headers.get("x-ster-job")
            if not job_id:  # every stream of a Ster server names its job
                raise NotSter(
                    f"{self.url} is not a Ster server: it answered {name} with "
                    f"{response.headers.get('content-type') or 'no content type'} and no job id",
                    first=True,
                )
            started.set()
            threading.Thread(
                target=self._cancel_when, args=(cancel, job_id, finished), daemon=True, name=f"ster cancel {job_id}"
            ).start()
            first = True
            for line in response.iter_lines():
                if not line.strip():
                    continue
                try:
                    event = parse_event(line)
                except ValueError:  # pydantic's ValidationError is one: a line that is not an event
                    raise NotSter(
                        f"{self.url} is not a Ster server: a line of its answer is not an event ({line[:60]!r})",
                        first=first,
                    ) from None
                first = False
                emit(event)
                if event.type == "result" or event.type == "error":
                    return event
        final = Error(kind="internal", message=f"the Ster server at {self.url} ended the stream before the job ended")
        emit(final)
        return final

    def _refused(self, name: str, response: Any) -> Error:
        response.read()
        try:
            sentence = str(json.loads(response.text)["error"])
        except (ValueError, KeyError, TypeError):  # not the JSON refusal a Ster server gives
            return Error(
                kind="refused",
                message=f"{self.url} is not a Ster server: it answered {name} with HTTP {response.status_code}",
            )
        if response.status_code == 404:
            sentence = f"the Ster server at {self.url} does not run {name} ({sentence})"
        elif response.status_code == 401:
            sentence = f"the Ster server at {self.url} refused the request: {sentence}"
        return Error(kind="refused" if response.status_code < 500 else "internal", message=sentence)

    def _cancel_when(self, cancel: threading.Event, job_id: str, finished: threading.Event) -> None:
        """Wait for the cancel flag while the job runs; when it is set, ask the server to cancel."""
        while not cancel.wait(0.1):
            if finished.is_set():
                return
        try:
            with self._client() as client:
                client.post(f"/v1/jobs/{job_id}/cancel")
        except Exception:  # the job may have ended meanwhile, or the server gone: the stream says which
            pass


class NotSter(Exception):
    """What answered is not a Ster server (``first``: nothing it sent was an event)."""

    def __init__(self, message: str, first: bool) -> None:
        super().__init__(message)
        self.first = first


def check_url(url: str) -> None:
    """Refuse a server URL that is not ``http://HOST[:PORT]`` or ``https://…``, in one sentence."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise WireRefusal(f"--server {url} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WireRefusal(
            f"--server {url} is not an http:// or https:// URL of a Ster server, such as http://127.0.0.1:8765"
        )


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.split("] ")[-1]
