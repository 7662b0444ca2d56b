"""The ASGI application behind ``ster serve``: every job at ``POST /v1/<operation>``, streamed as NDJSON.

One model job runs at a time, because jobs share the loaded models (a steering hook on a shared
decoder must never reach another job's forward pass); the others wait in a first-come queue and
are told their place in it. Jobs that read no model (inspecting an artifact, the workspace)
never wait, and neither does ``GET /v1/health``. A job runs on a worker thread; its events cross
into the event loop and out to the client as they happen. A client that goes away cancels its
job, or gives up its place in the queue, and the job stops at its next unit of work (the engine
checks between pairs, steps and tokens). The worker, not the connection, hands the model to the
next job, so a job cancelled mid-step still finishes that step before the next one starts.

Every response that is not a stream is a JSON object; a refusal is ``{"error": "<sentence>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ster.engine.protocol.events import Error, Event
from ster.engine.protocol.jobs import request_class, run_job
from ster.serve import limits, wire
from ster.serve.guard import UNAUTHORIZED, Root, token_matches

TYPED_MEDIA = "application/vnd.ster.events+x-ndjson"
"""The ``Accept`` type that asks for the typed event stream (so does ``?stream=events``)."""
JOB_HEADER = "x-ster-job"
"""The response header that names a streamed job, for ``POST /v1/jobs/<id>/cancel``."""


@dataclass(eq=False)
class Live:
    """One job the server has accepted: waiting for the model, running, or ending."""

    id: str
    prepared: wire.Prepared
    queued: bool
    """Whether the job needs the model, and so waits its turn."""
    cancel: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the job's place in the queue changed, or it was cancelled while waiting."""
    granted: bool = False
    started: bool = False
    ended: bool = False


class ModelThread:
    """The one thread on which the server computes with its models: model jobs, continuous batches, loading.

    PyTorch's CPU kernels run on an OpenMP team per calling thread, and GNU OpenMP stops its workers from
    spinning between parallel regions once it manages more threads than there are cores. A second thread
    that ever computed (one per job, say) thereby leaves every product waiting for its workers to wake: on
    two cores SmolLM2's decode step took 41 ms on a worker thread against 25 ms on the only one. So every
    computation goes through this one thread, in the order the model's queue grants it; the event loop, the
    jobs that read no model and the batches' coordination never compute.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ster model")

    def call(self, work: Any, *args: Any) -> Any:
        """Run ``work(*args)`` there and wait for its result (its exception is raised here)."""
        return self.pool.submit(work, *args).result()

    def start(self, work: Any) -> None:
        """Run ``work()`` there without waiting (it reports how it ended itself)."""
        self.pool.submit(work)


@dataclass(eq=False)
class BatchTurn:
    """A continuous batch's claim on the models (:mod:`ster.engine.serving.batcher`): granted beside other
    batches, never beside a job, and after every job that asked before it."""

    granted: threading.Event = field(default_factory=threading.Event)
    changed: threading.Event = field(default_factory=threading.Event)


class Jobs:
    """The model's queue and the jobs in flight. Touched only from the event loop (but ``jobs_waiting``, which
    a batcher's thread reads)."""

    def __init__(self) -> None:
        self.holder: Live | None = None
        """The job that has the model now (running, or ending after a cancel)."""
        self.batches: set[BatchTurn] = set()
        """Continuous batches decoding now (any number, side by side; never beside a job)."""
        self.waiting: deque[Live | BatchTurn] = deque()
        self.jobs_waiting = 0
        """How many jobs (not batches) wait: a batch admits no new rows while one does."""
        self.live: dict[str, Live] = {}
        self.counts = {"accepted": 0, "finished": 0, "cancelled": 0, "failed": 0}

    def admit(self, prepared: wire.Prepared) -> Live:
        needs_model = prepared.job not in wire.UNQUEUED or getattr(prepared.request, "model", None) is not None
        live = Live(uuid.uuid4().hex, prepared, queued=needs_model)
        self.live[live.id] = live
        self.counts["accepted"] += 1
        if not needs_model:
            live.granted = True
        elif self.holder is None and not self.batches and not self.waiting:
            live.granted, self.holder = True, live
        else:
            self.waiting.append(live)
            self.jobs_waiting += 1
        return live

    def ask(self, turn: BatchTurn) -> None:
        """A batch wants the models: granted at once unless a job holds them or waits."""
        if self.holder is None and self.jobs_waiting == 0:
            self.batches.add(turn)
            turn.granted.set()
        else:
            self.waiting.append(turn)

    def give_up(self, turn: BatchTurn) -> None:
        """A batch no longer wants the models (it was granted them, or is still waiting)."""
        if turn in self.waiting:
            self.waiting.remove(turn)
        self.batches.discard(turn)
        self._next()

    def ahead(self, live: Live) -> int:
        """Jobs before this one: the one holding the model (or the batches decoding) and those queued earlier."""
        return (1 if self.holder is not None or self.batches else 0) + self.waiting.index(live)

    def release(self, live: Live) -> None:
        """A worker ended: hand the model to the next job still waiting, and tell the rest their place."""
        live.ended = True
        if self.holder is live:
            self.holder = None
            self._next()

    def _next(self) -> None:
        """Hand the models on while nobody holds them: to the next job, or to every batch at the queue's head."""
        if self.holder is not None or self.batches or not self.waiting:
            return
        head = self.waiting[0]
        if isinstance(head, Live):
            self.waiting.popleft()
            self.jobs_waiting -= 1
            self.holder = head
            head.granted = True
        else:
            while self.waiting and isinstance(self.waiting[0], BatchTurn):
                turn = self.waiting.popleft()
                assert isinstance(turn, BatchTurn)
                self.batches.add(turn)
                turn.granted.set()
        for each in itertools.chain([self.holder] if self.holder else [], self.waiting):
            each.changed.set()

    def abandon(self, live: Live) -> None:
        """The client went away or asked to cancel: stop the job, or take it out of the queue."""
        live.cancel.set()
        if live in self.waiting:
            self.waiting.remove(live)
            self.jobs_waiting -= 1
            for each in self.waiting:
                each.changed.set()
            self._next()
        live.changed.set()

    def forget(self, live: Live, final: Event | None) -> None:
        self.live.pop(live.id, None)
        if final is None or (final.type == "error" and final.kind == "cancelled"):
            self.counts["cancelled"] += 1
        elif final.type == "result":
            self.counts["finished"] += 1
        else:
            self.counts["failed"] += 1

    def cancel_all(self) -> None:
        for live in list(self.live.values()):
            self.abandon(live)


class JobStream(Response):
    """A job's NDJSON stream; the job ends early when the client goes away."""

    def __init__(
        self,
        jobs: Jobs,
        prepared: wire.Prepared,
        typed: bool,
        models: Any,
        root: Root | None = None,
        compute: ModelThread | None = None,
    ) -> None:
        super().__init__(media_type="application/x-ndjson")
        self.jobs, self.prepared, self.typed, self.models = jobs, prepared, typed, models
        self.root, self.compute = root, compute
        self.lines = wire.typed_lines if typed else wire.default_lines

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        live = self.jobs.admit(self.prepared)
        headers = [
            (b"content-type", b"application/x-ndjson"),
            (b"cache-control", b"no-cache"),
            (JOB_HEADER.encode(), live.id.encode()),
        ]
        watcher = asyncio.create_task(self._watch(receive, live))
        final: Event | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            final = await self._run(live, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ClientDisconnect):  # the client is gone; the watcher has cancelled the job
            self.jobs.abandon(live)
        finally:
            watcher.cancel()
            if not live.ended:
                self.jobs.abandon(live)
            if not live.started:
                live.ended = True
            self.jobs.forget(live, final)

    async def _run(self, live: Live, send: Any) -> Event | None:
        job = self.prepared.job
        while not live.granted and not live.cancel.is_set():
            live.changed.clear()
            for chunk in self.lines(job, wire.queue_event(self.jobs.ahead(live))):
                await self._body(send, chunk)
            await live.changed.wait()
        if live.cancel.is_set() and not live.granted:
            final: Event = Error(kind="cancelled", message="cancelled before it started; nothing was written")
            for chunk in self.lines(job, final):
                await self._body(send, chunk)
            return final
        self._start(live)
        while True:
            event = await live.events.get()
            for chunk in self.lines(job, event):
                await self._body(send, chunk)
            if event.type in ("result", "error"):
                return event

    def _start(self, live: Live) -> None:
        loop = asyncio.get_running_loop()
        live.started = True

        def put(event: Event) -> None:
            loop.call_soon_threadsafe(live.events.put_nowait, event)

        def work() -> None:
            try:
                run_job(self.prepared.job, self.prepared.request, put, live.cancel, self.models, root=self.root)
            finally:
                loop.call_soon_threadsafe(self.jobs.release, live)

        if live.queued and self.compute is not None:  # a model job computes on the model's thread
            self.compute.start(work)
        else:
            threading.Thread(target=work, name=f"ster serve {self.prepared.job}", daemon=True).start()

    @staticmethod
    async def _body(send: Any, chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _watch(self, receive: Any, live: Live) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.jobs.abandon(live)
                return


def refusal(sentence: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": sentence}, status_code=status)


class SlowBody(Exception):
    """The body paused longer than :data:`ster.serve.limits.BODY_TIMEOUT` between two chunks."""


async def read_body(request: Request) -> bytes:
    """The body, refused as too large before more than the limit is read, and given up on when it stalls."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > wire.BODY_LIMIT:
        raise wire.WireRefusal(wire.TOO_LARGE)
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), limits.BODY_TIMEOUT)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise SlowBody() from None
        size += len(chunk)
        if size > wire.BODY_LIMIT:
            raise wire.WireRefusal(wire.TOO_LARGE)
        chunks.append(chunk)
    return b"".join(chunks)


def wants_typed(request: Request) -> bool:
    return request.query_params.get("stream") == "events" or TYPED_MEDIA in request.headers.get("accept", "")


class LastResort:
    """ASGI middleware: an exception nothing else handled is said in one line on stderr, never as a
    traceback, and answered ``500 {"error": …}`` when no answer has started (a started stream just ends)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            limits.say(
                f"error: internal error serving {scope.get('method')} {scope.get('path')}: {limits.sentence(exc)}"
            )
            if limits.debug():
                import traceback

                limits.say(traceback.format_exc())
            if not started:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await refusal(internal_sentence(exc), 500)(scope, receive, send)


def internal_sentence(exc: BaseException) -> str:
    return f"internal error in the server: {limits.sentence(exc)}"


class TokenGate:
    """ASGI middleware: every request but ``GET /v1/health`` carries the bearer token, or gets 401."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token
        self.state: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.token is not None and scope["path"] != "/v1/health":
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if not token_matches(header, self.token):
                from ster.serve.openai import OPENAI_PATHS, OpenAIError

                openai = scope["path"].startswith(OPENAI_PATHS)
                body = OpenAIError(UNAUTHORIZED, status=401, code="invalid_api_key").body() if openai else None
                response = JSONResponse(
                    body or {"error": UNAUTHORIZED}, status_code=401, headers={"www-authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(token: str | None = None, root: Root | None = None, models: Any = None) -> Any:
    """The application: the job endpoints, health, the workspace, and job cancellation."""
    if models is None:
        from ster.engine.model.loading import ModelStore

        models = ModelStore()
    from ster.serve.openai import Served, add_routes

    jobs = Jobs()
    compute = ModelThread()
    served = Served(models, jobs, root, compute)
    app = FastAPI(
        title="Ster",
        summary="Activation steering and LoRA post-training jobs, streamed as NDJSON",
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.jobs = jobs
    app.state.served = served
    app.state.compute = compute

    @app.exception_handler(HTTPException)
    async def unknown(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return refusal(f"unknown endpoint: {request.method} {request.url.path}", 404)
        return refusal(str(exc.detail), exc.status_code)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        """Whether the server answers; never waits for a job."""
        running = 1 if jobs.holder is not None else 0
        batch = {
            name: {
                "rows": each.batcher.running,
                "waiting": each.batcher.waiting,
                "steps": each.batcher.steps,
                "peak_rows": each.batcher.peak_rows,
                "cache_bytes": each.batcher.cache_bytes,
                "busy_seconds": round(each.batcher.busy, 3),
            }
            for name, each in sorted(served.models.items())
        }
        return {
            "status": "ok",
            "running": running,
            "queued": jobs.jobs_waiting,
            "jobs": dict(jobs.counts),
            "batches": batch,
        }

    @app.get("/v1/workspace")
    async def workspace() -> JSONResponse:
        """The workspace's sets and its active one (``ster workspace show``); never waits for a job."""
        from starlette.concurrency import run_in_threadpool

        prepared = wire.prepare("workspace/show", {})
        final = await run_in_threadpool(run_job, prepared.job, prepared.request, lambda event: None)
        if final.type == "result":
            return JSONResponse(final.data)
        return refusal(final.message, 500 if final.kind == "internal" else 400)

    @app.post("/v1/jobs/{job_id}/cancel")
    async def cancel(job_id: str) -> JSONResponse:
        """Cancel a streamed job by the id its ``x-ster-job`` header gave; its stream still ends with its last event."""
        live = jobs.live.get(job_id)
        if live is None:
            return refusal(f"no job {job_id} is running or waiting", 404)
        jobs.abandon(live)
        return JSONResponse({"cancelled": job_id})

    add_routes(app, served)
    for operation, job in wire.OPERATIONS.items():
        app.add_api_route(
            f"/v1/{operation}",
            _endpoint(operation, jobs, root, models, compute),
            methods=["POST"],
            name=operation,
            summary=f"ster {job}",
            response_class=Response,
            openapi_extra=_body_schema(job),
            responses={200: {"content": {"application/x-ndjson": {}}}},
        )
    app.openapi = _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented way to replace the schema

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return refusal(internal_sentence(exc), 500)  # the middleware outside says it in one line

    gate = TokenGate(LastResort(app), token)
    gate.state = app.state
    return gate


def _endpoint(operation: str, jobs: Jobs, root: Root | None, models: Any, compute: ModelThread) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            body = wire.parse_body(await read_body(request))
            prepared = wire.prepare(operation, body, root)
        except wire.WireRefusal as exc:
            return refusal(str(exc).split(":")[0] if str(exc).startswith(wire.NOT_JSON) else str(exc))
        except UnicodeDecodeError:
            return refusal(wire.NOT_JSON)
        except ClientDisconnect:  # gone before its whole body came: no job starts, and the answer goes nowhere
            return refusal("the client went away before its request body was read")
        except SlowBody:
            return JSONResponse({"error": limits.SLOW_BODY}, status_code=408, headers={"connection": "close"})
        return JobStream(jobs, prepared, wants_typed(request), models, root, compute)

    endpoint.__doc__ = f"Run ``ster {wire.OPERATIONS[operation]}``; the body's fields are its flags in camelCase."
    return endpoint


BODY_SCHEMAS: dict[str, Any] = {}
"""Schemas the request bodies refer to, gathered for the OpenAPI document's components."""


def _body_schema(job: str) -> dict[str, Any]:
    """The request body of a job, its fields in camelCase, for ``/docs``."""
    try:
        schema = request_class(job).model_json_schema(ref_template="#/components/schemas/{model}")
    except Exception:  # a field type without a JSON schema: document the body as an object
        schema = {"type": "object"}
    BODY_SCHEMAS.update(schema.pop("$defs", {}))
    schema["properties"] = {wire.camel(name): value for name, value in schema.get("properties", {}).items()}
    schema.pop("required", None)  # the server says what is missing in the original's words
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": schema}}}}


def _openapi(app: FastAPI) -> Any:
    from fastapi.openapi.utils import get_openapi

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version="1", summary=app.summary, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(BODY_SCHEMAS)
            app.openapi_schema = document
        return app.openapi_schema

    return build
