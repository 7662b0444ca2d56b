"""OpenAI's wire format on ``ster serve``: chat and text completions with a ``steering`` field per request.

``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models`` answer as OpenAI's API does,
so its official client, agent frameworks and evaluation harnesses can talk to a steered model: JSON, or
with ``stream`` server-sent events (``data: {...}`` chunks, then ``data: [DONE]``), ``usage`` and
``finish_reason`` included. Errors have OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``, with the status OpenAI gives, and one sentence naming the field.

Every request's rows join one continuous batch per model (:mod:`ster.engine.serving.batcher`) at the
next step, each with its own steering spec (:mod:`ster.engine.serving.spec`), sampler and stops. The
batches take the models through the same queue as the server's jobs (:class:`ster.serve.app.Jobs`):
a job (training, say) waits for the rows decoding now, and rows that arrive while a job runs wait for
it, told so in the stream as an SSE comment. ``POST``/``GET``/``DELETE /v1/steering`` keep a registry of
named vectors and adapters.

Two of vLLM's fields are honoured too: ``ignore_eos`` and ``min_tokens`` (a fixed number of tokens, as load
tests want). Fields OpenAI defines and Ster does not use are ignored when they cannot change the text (``user``,
``metadata``, ``store``, ``parallel_tool_calls``…); one that would change it and that Ster cannot honour
(tools, a response format, logit biases, penalties) is refused by name rather than silently dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ster.engine.protocol.errors import Refusal, SterError
from ster.engine.serving.resolve import Registered, Registry, Resolved, SpecRefusal, artifact_reader, resolve
from ster.engine.serving.spec import SteeringSpec, error_sentence, parse_spec
from ster.serve import limits, wire
from ster.serve.guard import Root

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/steering")
"""Where errors take OpenAI's shape (the token's 401 too)."""
MAX_N = 16
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
UNHONOURED: dict[str, Callable[[Any], bool]] = {
    "tools": lambda value: bool(value),
    "functions": lambda value: bool(value),
    "tool_choice": lambda value: value not in (None, "none"),
    "function_call": lambda value: value not in (None, "none"),
    "response_format": lambda value: value is not None and (not isinstance(value, dict) or value.get("type") != "text"),
    "logit_bias": lambda value: bool(value),
    "presence_penalty": lambda value: value not in (None, 0, 0.0),
    "frequency_penalty": lambda value: value not in (None, 0, 0.0),
    "echo": lambda value: bool(value),
    "suffix": lambda value: bool(value),
    "audio": lambda value: value is not None,
    "modalities": lambda value: value not in (None, ["text"]),
    "prediction": lambda value: value is not None,
}
"""OpenAI fields that change the result and that this server cannot honour, with when they ask for something."""


class OpenAIError(Exception):
    """A refusal in OpenAI's shape."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_json(message: str, status: int, param: str | None = None, code: str | None = None) -> JSONResponse:
    return OpenAIError(message, param, status, code).response()


# ---- the models served ----


@dataclass
class ServedModel:
    """A model the server decodes: its checkpoint, its decoder, and its continuous batch."""

    name: str
    checkpoint: Any
    decoder: Any
    batcher: Any
    created: int = field(default_factory=lambda: int(time.time()))


class BatchTurnBridge:
    """A batcher's :class:`~ster.engine.serving.batcher.Turn` on the server's job queue, from its own thread."""

    def __init__(self, jobs: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.jobs, self.loop = jobs, loop
        self.turn: Any = None

    def acquire(self, stop: threading.Event, waiting: Callable[[str], None]) -> bool:
        from ster.serve.app import BatchTurn

        turn = BatchTurn()
        self.loop.call_soon_threadsafe(self.jobs.ask, turn)
        told = False
        while not turn.granted.wait(0.05):
            if stop.is_set():
                self.loop.call_soon_threadsafe(self.jobs.give_up, turn)
                return False
            if not told:
                waiting("waiting for the server's running job to finish with the model")
                told = True
        self.turn = turn
        return True

    def release(self) -> None:
        if self.turn is not None:
            self.loop.call_soon_threadsafe(self.jobs.give_up, self.turn)
            self.turn = None

    def wanted(self) -> bool:
        return bool(self.jobs.jobs_waiting)


class Outbox:
    """Events from the batchers' threads to the requests' queues on the event loop, handed on in one wake-up of
    the loop per step (``flush``) rather than one per token: sixteen rows' tokens cost the loop one call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[tuple[asyncio.Queue[Any], Any]] = deque()
        self.lock = threading.Lock()
        self.pending = False

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        self.items.append((queue, item))

    def flush(self) -> None:
        with self.lock:
            if self.pending or not self.items:
                return
            self.pending = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            self.pending = False
        while self.items:
            queue, item = self.items.popleft()
            queue.put_nowait(item)


class Served:
    """The models, the registry, and how a request's names become files under the root."""

    def __init__(self, store: Any, jobs: Any, root: Root | None, compute: Any = None, max_rows: int = 32) -> None:
        self.store, self.jobs, self.root, self.max_rows = store, jobs, root, max_rows
        self.compute = compute
        """The server's :class:`~ster.serve.app.ModelThread`: loading and every batch's steps run there."""
        self.models: dict[str, ServedModel] = {}
        self.aliases: dict[str, str] = {}
        self.registry = Registry()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outbox: Outbox | None = None
        self._lock = threading.Lock()

    def load(self, name: str, requested: bool = True) -> ServedModel:
        """The model ``name`` names, loaded once (blocking: call from a worker thread, or before serving). A request
        (``requested``) may name a loaded model, a bundled one or a checkpoint directory, never a Hub id to fetch."""
        with self._lock:
            known = self.models.get(self.aliases.get(name, name))
            if known is not None:
                return known
        if self.root is not None:
            try:
                self.root.check_model(name, "model")
            except wire.WireRefusal as exc:
                raise OpenAIError(str(exc), "model", 404, "model_not_found") from None
        elif requested and not name.startswith("ster:") and not Path(name).is_dir():
            raise OpenAIError(
                f"the model {name} is not served here: name one GET /v1/models lists, a bundled ster: model, or a "
                "checkpoint directory (a Hub id is fetched only by --model at start)",
                "model",
                404,
                "model_not_found",
            )
        from ster.engine.protocol import confine
        from ster.engine.protocol.jobs import JobContext
        from ster.engine.steering.requests import GenerateRequest

        ctx = JobContext(lambda event: None)

        def read() -> tuple[Any, Any]:
            request = GenerateRequest(model=name, prompt="-")
            with confine.within(self.root) if self.root is not None else _nothing():
                checkpoint = self.store.open(request, ctx)
                return checkpoint, self.store.decoder(checkpoint, ctx)

        try:
            checkpoint, decoder = read() if self.compute is None else self.compute.call(read)
        except (SterError, ValueError) as exc:
            raise OpenAIError(f"model {name} cannot be served: {exc}", "model", 404, "model_not_found") from None
        from ster.engine.serving.batcher import Batcher, FreeTurn

        turn = BatchTurnBridge(self.jobs, self.loop) if self.loop is not None else FreeTurn()
        runner = None if self.compute is None else self.compute.call
        flush = None if self.outbox is None else self.outbox.flush
        batcher = Batcher(decoder, turn, max_rows=self.max_rows, runner=runner, flush=flush)
        served = ServedModel(name, checkpoint, decoder, batcher)
        with self._lock:
            self.models.setdefault(name, served)
            alias = Path(name).name
            if alias and alias != name and alias not in self.models:
                self.aliases.setdefault(alias, name)
            return self.models[name]

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the job queue lives on: batchers made before it (``--model``) take their turns there."""
        self.loop = loop
        self.outbox = Outbox(loop)
        for served in self.models.values():
            if not isinstance(served.batcher.turn, BatchTurnBridge):
                served.batcher.turn = BatchTurnBridge(self.jobs, loop)
                served.batcher.flush = self.outbox.flush

    def close(self) -> None:
        for served in self.models.values():
            served.batcher.close()

    def read_path(self, text: str, what: str) -> Path:
        """A file a request names, confined under the root (refused in one sentence otherwise)."""
        if self.root is not None:
            try:
                self.root.check_inside(text, what)
            except wire.WireRefusal as exc:
                raise Refusal(str(exc)) from None
        return Path(text)

    def adapter(self, name: str | None, model: ServedModel) -> Any:
        """The LoRA adapter a request names (a registered name, else a path under the root), read and checked
        against the model; None for none."""
        if name is None:
            return None
        from ster.engine.model.adapters.apply import open_adapter
        from ster.engine.protocol import confine
        from ster.engine.protocol.jobs import JobContext

        entry = self.registry.get(name)
        if entry is not None and entry.kind != "adapter":
            raise OpenAIError(
                f"adapter names {name}, which is registered as a steering vector, not an adapter", "adapter"
            )
        path = entry.path if entry is not None else name
        try:
            with confine.within(self.root) if self.root is not None else _nothing():
                located = self.read_path(path, "adapter")
                return open_adapter(JobContext(lambda event: None), located, model.checkpoint, "adapter")[1]
        except SterError as exc:
            raise OpenAIError(str(exc), "adapter") from None

    def artifact_loader(self) -> Callable[[str, str], Any]:
        from ster.engine.protocol import confine

        reader = artifact_reader(self.registry, lambda text: self.read_path(text, "steering vector"))

        def load(name: str, param: str) -> Any:
            with confine.within(self.root) if self.root is not None else _nothing():
                return reader(name, param)

        return load


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---- the request bodies ----


@dataclass
class Parsed:
    """A completion request, checked: what each row decodes."""

    model: str
    prompts: list[list[int]]
    prompt_text: list[str]
    chat: bool
    n: int
    max_tokens: int | None
    temperature: float
    top_p: float | None
    seed: int | None
    stops: list[str]
    stream: bool
    include_usage: bool
    logprobs: int | None
    spec: SteeringSpec | None
    adapter: str | None


def _number(body: dict[str, Any], name: str, low: float, high: float, default: float | None) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise OpenAIError(f"{name} must be a number from {low:g} to {high:g}; got {json.dumps(value)[:40]}", name)
    return float(value)


def _whole(body: dict[str, Any], name: str, low: int, high: int | None, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        upper = f" to {high}" if high is not None else " or more"
        raise OpenAIError(f"{name} must be a whole number from {low}{upper}; got {json.dumps(value)[:40]}", name)
    return value


def parse_request(body: Any, chat: bool) -> dict[str, Any]:
    """The fields every completion shares, checked before any model is looked up."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    for name, asks in UNHONOURED.items():
        if name in body and asks(body[name]):
            raise OpenAIError(f"{name} is not supported by this server; leave it out", name, code="unsupported_field")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise OpenAIError("model is required: the name of a served model (see GET /v1/models)", "model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise OpenAIError("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise OpenAIError("stream_options is only allowed with stream true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError("stream_options must be an object", "stream_options")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise OpenAIError(f"stop must be a string or a list of up to {MAX_STOPS} strings", "stop")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise OpenAIError("seed must be a whole number from 0 to 2^63-1", "seed")
    if chat:
        wants = body.get("logprobs")
        if wants is not None and not isinstance(wants, bool):
            raise OpenAIError("logprobs must be true or false", "logprobs")
        top = _whole(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, None)
        if top is not None and not wants:
            raise OpenAIError("top_logprobs needs logprobs true", "top_logprobs")
        logprobs = (top or 0) if wants else None
    else:
        logprobs = _whole(body, "logprobs", 0, 5, None)
    n = _whole(body, "n", 1, MAX_N, 1)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise OpenAIError("ignore_eos must be true or false", "ignore_eos")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise OpenAIError("best_of other than n is not supported by this server; leave it out", "best_of")
    try:
        spec = parse_spec(body.get("steering"))
    except ValidationError as exc:
        message, param = error_sentence(exc, "steering")
        raise OpenAIError(message, param) from None
    adapter = body.get("adapter")
    if adapter is not None and (not isinstance(adapter, str) or not adapter.strip()):
        raise OpenAIError("adapter must name a LoRA adapter: a path or a registered name", "adapter")
    return {
        "model": model,
        "n": n,
        "max_tokens": _whole(body, limit, 1, None, None),
        "limit_name": limit,
        "temperature": _number(body, "temperature", 0.0, 2.0, 1.0),
        "top_p": _number(body, "top_p", 0.0, 1.0, None),
        "seed": seed,
        "stops": stops,
        "stream": bool(stream),
        "include_usage": bool(options and options.get("include_usage")),
        "logprobs": logprobs,
        "spec": spec,
        "adapter": adapter,
        "chat": chat,
        "ignore_eos": ignore_eos,
        "min_tokens": _whole(body, "min_tokens", 0, None, 0),
    }


def chat_prompt(served: ServedModel, body: dict[str, Any]) -> tuple[list[int], str]:
    """The conversation rendered under the model's chat template, ready for the assistant's answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise OpenAIError(f"{param} must be an object with role and content", param)
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise OpenAIError(
                f"{param}.role must be system, developer, user or assistant; got {json.dumps(role)[:40]}",
                f"{param}.role",
            )
        turns.append({"role": role, "content": _content(message.get("content"), f"{param}.content")})
    template = served.checkpoint.codec.template
    if template is None:
        raise OpenAIError(
            f"model {served.name} has no chat template, so it cannot take messages; send the text as prompt to "
            "/v1/completions",
            "messages",
        )
    try:
        text = template.render(turns, add_generation_prompt=True)
    except SterError as exc:
        raise OpenAIError(f"the chat template refused these messages: {exc}", "messages") from None
    ids = served.checkpoint.codec.tokenizer.encode(text, add_special_tokens=False).ids
    return ids, text


def _content(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(f"{param} may hold only text parts ({{type: text, text}}) on this server", param)
            parts.append(part["text"])
        return "".join(parts)
    raise OpenAIError(f"{param} must be a string or a list of text parts", param)


def completion_prompts(served: ServedModel, body: dict[str, Any]) -> list[tuple[list[int], str]]:
    """Each prompt of a text completion: a string, a list of strings, a list of token ids, or a list of those."""
    prompt = body.get("prompt")
    tokenizer = served.checkpoint.codec.tokenizer
    vocab = served.checkpoint.config.vocab_size
    items: list[Any]
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise OpenAIError("prompt must be a string, a list of strings, or a list of token ids", "prompt")
    out = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            ids = tokenizer.encode(item).ids
            out.append((ids, item))
        elif isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if not all(0 <= t < vocab for t in item):
                raise OpenAIError(f"prompt[{index}] holds a token id outside the vocabulary of {vocab}", "prompt")
            out.append((list(item), tokenizer.decode(item, skip_special_tokens=False)))
        else:
            raise OpenAIError(f"prompt[{index}] must be a string or a list of token ids", "prompt")
        if not out[-1][0]:
            raise OpenAIError(f"prompt[{index}] encodes to no tokens; give some text", "prompt")
    return out


# ---- running a request ----


@dataclass
class Choice:
    index: int
    prompt_tokens: int
    text: list[str] = field(default_factory=list)
    tokens: list[tuple[int, float | None, list[tuple[int, float]] | None]] = field(default_factory=list)
    end: Any = None


class Completion:
    """One request's rows in a model's batch, and the events they send back to the event loop."""

    def __init__(self, served: ServedModel, parsed: dict[str, Any], prompts: list[list[int]], chat: bool) -> None:
        self.served, self.parsed, self.prompts, self.chat = served, parsed, prompts, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.rows: list[Any] = []
        self.choices: list[Choice] = []
        self.resolved: list[Resolved] = []

    def build(self, steering: list[Resolved], budget: int, outbox: Outbox, adapter: Any = None) -> None:
        from ster.engine.model.sampling import Sampling
        from ster.engine.serving.batcher import RowText, ServedRow

        parsed, codec = self.parsed, self.served.checkpoint.codec
        base_seed = parsed["seed"] if parsed["seed"] is not None else secrets.randbelow(2**62)
        index = 0
        for prompt in self.prompts:
            for copy in range(parsed["n"]):
                choice = Choice(index, len(prompt))
                sampling = Sampling(parsed["temperature"], parsed["top_p"], base_seed + copy)

                def sink(event: Any, at: int = index) -> None:
                    outbox.put(self.events, (at, event))

                row = ServedRow(
                    prompt_ids=prompt,
                    sampling=sampling,
                    max_new_tokens=budget,
                    eos_ids=frozenset() if parsed["ignore_eos"] else codec.eos_ids,
                    text=RowText(codec, parsed["stops"]),
                    min_tokens=min(parsed["min_tokens"], budget),
                    sink=sink,
                    interventions=[each.row for each in steering],
                    adapter=adapter,
                    logprobs=parsed["logprobs"],
                )
                self.rows.append(row)
                self.choices.append(choice)
                index += 1
        self.resolved = steering

    def submit(self) -> None:
        for row in self.rows:
            self.served.batcher.submit(row)

    def cancel(self) -> None:
        for row in self.rows:
            row.cancelled.set()

    def ster_field(self) -> dict[str, Any]:
        """What Ster adds to the response: the interventions as resolved, each row's conditions, the adapter."""
        steering = []
        for k, each in enumerate(self.resolved):
            shown = dict(each.shown)
            if each.row.condition is not None:
                shown["condition"] = [
                    {
                        "index": choice.index,
                        "passed": choice.end.conditions[k] if choice.end and choice.end.conditions else None,
                        "measure": choice.end.measures[k] if choice.end and choice.end.measures else None,
                    }
                    for choice in self.choices
                ]
            steering.append(shown)
        return {"steering": steering, "adapter": self.parsed["adapter"]}

    def usage(self) -> dict[str, int]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(choice.end.completion_tokens if choice.end else 0 for choice in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(end: Any) -> str:
    return "length" if end.reason == "length" else "stop"


def _token_text(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token], skip_special_tokens=False))


def chat_logprobs(tokenizer: Any, entries: list[tuple[int, float | None, list[tuple[int, float]] | None]]) -> Any:
    content = []
    for token, logprob, top in entries:
        if token < 0:
            continue
        text = _token_text(tokenizer, token)
        content.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": (t := _token_text(tokenizer, i)), "logprob": value, "bytes": list(t.encode())}
                    for i, value in (top or [])
                ],
            }
        )
    return {"content": content}


def completion_logprobs(tokenizer: Any, entries: list[tuple[int, float | None, list[tuple[int, float]] | None]]) -> Any:
    tokens, values, tops, offsets, at = [], [], [], [], 0
    for token, logprob, top in entries:
        if token < 0:
            continue
        text = _token_text(tokenizer, token)
        tokens.append(text)
        values.append(logprob)
        tops.append({_token_text(tokenizer, i): value for i, value in (top or [])})
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class CompletionResponse(Response):
    """The answer to a completion: one JSON object, or an SSE stream; the rows stop when the client goes away."""

    def __init__(self, completion: Completion) -> None:
        super().__init__()
        self.completion = completion

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        completion = self.completion
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    completion.cancel()
                    gone.set()
                    completion.events.put_nowait((-1, None))  # wakes the reader, which sees the client gone
                    return

        watcher = asyncio.create_task(watch())
        completion.submit()
        try:
            if completion.parsed["stream"]:
                await self._stream(send, gone)
            else:
                await self._whole(send, gone)
        except (OSError, ClientDisconnect):
            completion.cancel()
        finally:
            watcher.cancel()
            completion.cancel()  # a row still running (an error mid-way) stops at the next step

    async def _next(self, gone: asyncio.Event) -> tuple[int, Any] | None:
        if gone.is_set():
            return None
        item = await self.completion.events.get()
        return None if gone.is_set() or item[0] < 0 else item

    async def _collect(self, gone: asyncio.Event, each: Callable[[int, Any], Any] | None = None) -> bool:
        from ster.engine.serving.batcher import EndEvent, TokenEvent

        completion, left = self.completion, len(self.completion.choices)
        while left:
            item = await self._next(gone)
            if item is None:
                return False
            index, event = item
            choice = completion.choices[index]
            if isinstance(event, TokenEvent):
                choice.text.append(event.text)
                choice.tokens.append((event.token, event.logprob, event.top))
            elif isinstance(event, EndEvent):
                choice.end = event
                left -= 1
            if each is not None:
                await each(index, event)
        return True

    async def _whole(self, send: Any, gone: asyncio.Event) -> None:
        completion = self.completion
        if not await self._collect(gone):
            return
        failed = next((c.end for c in completion.choices if c.end.reason in ("error", "cancelled")), None)
        if failed is not None:
            status = 503 if failed.reason == "cancelled" else 500
            await OpenAIError(failed.message or "the request was cancelled", status=status).response()(
                {"type": "http"}, _no_receive, send
            )
            return
        tokenizer = completion.served.checkpoint.codec.tokenizer
        choices = []
        for choice in completion.choices:
            text = "".join(choice.text)
            wanted = completion.parsed["logprobs"] is not None
            if completion.chat:
                choices.append(
                    {
                        "index": choice.index,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": chat_logprobs(tokenizer, choice.tokens) if wanted else None,
                        "finish_reason": finish_reason(choice.end),
                    }
                )
            else:
                choices.append(
                    {
                        "index": choice.index,
                        "text": text,
                        "logprobs": completion_logprobs(tokenizer, choice.tokens) if wanted else None,
                        "finish_reason": finish_reason(choice.end),
                    }
                )
        body = {
            "id": completion.id,
            "object": "chat.completion" if completion.chat else "text_completion",
            "created": completion.created,
            "model": completion.served.name,
            "choices": choices,
            "usage": completion.usage(),
            "system_fingerprint": None,
            "ster": completion.ster_field(),
        }
        await JSONResponse(body)({"type": "http"}, _no_receive, send)

    async def _stream(self, send: Any, gone: asyncio.Event) -> None:
        from ster.engine.serving.batcher import EndEvent, TokenEvent, WaitEvent

        completion = self.completion
        chat, usage_wanted = completion.chat, completion.parsed["include_usage"]
        tokenizer = completion.served.checkpoint.codec.tokenizer
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )

        def chunk(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
            body: dict[str, Any] = {
                "id": completion.id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": completion.created,
                "model": completion.served.name,
                "system_fingerprint": None,
                "choices": choices,
            }
            if usage_wanted:
                body["usage"] = usage
            return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

        async def out(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if chat:
            for choice in completion.choices:
                first = {"role": "assistant", "content": ""}
                await out(chunk([{"index": choice.index, "delta": first, "logprobs": None, "finish_reason": None}]))
        told = False

        async def each(index: int, event: Any) -> None:
            nonlocal told
            if isinstance(event, WaitEvent):
                if not told:
                    await out(f": {event.message}\n\n".encode())
                    told = True
                return
            if isinstance(event, TokenEvent):
                if not event.text and event.logprob is None:
                    return
                entries = [(event.token, event.logprob, event.top)]
                wanted = completion.parsed["logprobs"] is not None and event.token >= 0
                if chat:
                    logprobs = chat_logprobs(tokenizer, entries) if wanted else None
                    piece = {
                        "index": index,
                        "delta": {"content": event.text},
                        "logprobs": logprobs,
                        "finish_reason": None,
                    }
                else:
                    logprobs = completion_logprobs(tokenizer, entries) if wanted else None
                    piece = {"index": index, "text": event.text, "logprobs": logprobs, "finish_reason": None}
                await out(chunk([piece]))
                return
            assert isinstance(event, EndEvent)
            if event.reason in ("error", "cancelled"):
                error = OpenAIError(event.message or "the request was cancelled", status=500).body()
                await out(b"data: " + json.dumps(error, separators=(",", ":")).encode() + b"\n\n")
                return
            reason = finish_reason(event)
            last: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": reason}
            if chat:
                last["delta"] = {}
            else:
                last["text"] = ""
            await out(chunk([last]))

        if not await self._collect(gone, each):
            return
        if usage_wanted:
            await out(chunk([], completion.usage()))
        ster = {"ster": completion.ster_field()}
        await out(b": ster " + json.dumps(ster, separators=(",", ":")).encode() + b"\n\n")
        await out(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


# ---- the routes ----


def add_routes(app: FastAPI, served: Served) -> None:
    """The OpenAI-compatible endpoints and the steering registry on ``app``."""

    async def body_of(request: Request) -> Any:
        from ster.serve.app import SlowBody, read_body

        try:
            raw = await read_body(request)
        except wire.WireRefusal as exc:
            raise OpenAIError(str(exc), status=413 if str(exc) == wire.TOO_LARGE else 400) from None
        except SlowBody:
            raise OpenAIError(limits.SLOW_BODY, status=408) from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise OpenAIError("the request body is not valid JSON") from None

    async def completion(request: Request, chat: bool) -> Response:
        if served.loop is None:
            served.bind(asyncio.get_running_loop())
        try:
            body = await body_of(request)
            parsed = parse_request(body, chat)
            model = await run_in_threadpool(served.load, parsed["model"])
            prompts = [chat_prompt(model, body)] if chat else completion_prompts(model, body)
            ids = [each[0] for each in prompts]
            budget = _budget(model, ids, parsed)
            steering = await run_in_threadpool(_steering, served, model, parsed["spec"])
            adapter = None
            if parsed["adapter"] is not None:  # tensors are made on the model's thread (see ModelThread)
                call = served.compute.call if served.compute is not None else (lambda work, *a: work(*a))
                adapter = await run_in_threadpool(call, served.adapter, parsed["adapter"], model)
        except OpenAIError as exc:
            return exc.response()
        except ClientDisconnect:
            return error_json("the client went away before its request body was read", 400)
        job = Completion(model, parsed, ids, chat)
        assert served.outbox is not None
        job.build(steering, budget, served.outbox, adapter)
        return CompletionResponse(job)

    @app.post("/v1/chat/completions", tags=["OpenAI"], openapi_extra=_schema("chat"))
    async def chat_completions(request: Request) -> Response:
        """OpenAI's chat completion, with Ster's ``steering`` field (its schema: ``SteeringSpec``)."""
        return await completion(request, True)

    @app.post("/v1/completions", tags=["OpenAI"], openapi_extra=_schema("text"))
    async def completions(request: Request) -> Response:
        """OpenAI's (legacy) text completion, with Ster's ``steering`` field."""
        return await completion(request, False)

    @app.get("/v1/models", tags=["OpenAI"])
    async def models() -> JSONResponse:
        """The models loaded now (``--model`` at start, and any a request loaded since)."""
        data = [
            {"id": name, "object": "model", "created": each.created, "owned_by": "ster"}
            for name, each in sorted(served.models.items())
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/steering", tags=["Steering registry"])
    async def registered() -> JSONResponse:
        """The vectors and adapters registered by name."""
        return JSONResponse({"object": "list", "data": [entry.shown() for entry in served.registry.listed()]})

    @app.post("/v1/steering", tags=["Steering registry"])
    async def register(request: Request) -> Response:
        """Register or replace a name: ``{"name", "vector": path}`` or ``{"name", "adapter": path}``. Requests
        already running keep what they resolved."""
        try:
            body = await body_of(request)
            entry = await run_in_threadpool(_entry, served, body)
        except OpenAIError as exc:
            return exc.response()
        replaced = served.registry.put(entry)
        return JSONResponse({"registered": entry.shown(), "replaced": replaced}, status_code=200 if replaced else 201)

    @app.delete("/v1/steering/{name}", tags=["Steering registry"])
    async def unregister(name: str) -> JSONResponse:
        """Remove a name; requests already running keep what they resolved."""
        removed = served.registry.remove(name)
        if removed is None:
            return error_json(f"no vector or adapter is registered as {name}", 404, "name", "not_found")
        return JSONResponse({"deleted": name, "kind": removed.kind})


def _budget(model: ServedModel, prompts: list[list[int]], parsed: dict[str, Any]) -> int:
    context = model.checkpoint.context
    longest = max(len(p) for p in prompts)
    room = context - longest
    name = parsed["limit_name"]
    if room < 1:
        raise OpenAIError(
            f"the {longest}-token prompt fills the model's context of {context} tokens, leaving no room to generate",
            "messages" if parsed["chat"] else "prompt",
            code="context_length_exceeded",
        )
    wanted = parsed["max_tokens"]
    if wanted is None:
        return room
    if wanted > room:
        raise OpenAIError(
            f"the {longest}-token prompt and {name} {wanted} need {longest + wanted} positions, more than the "
            f"model's context of {context}; give {name} {room} or fewer",
            name,
            code="context_length_exceeded",
        )
    return int(wanted)


def _steering(served: Served, model: ServedModel, spec: SteeringSpec | None) -> list[Resolved]:
    if spec is None:
        return []
    from ster.engine.protocol.jobs import JobContext

    try:
        return resolve(spec, model.checkpoint, served.artifact_loader(), JobContext(lambda event: None))
    except SpecRefusal as exc:
        raise OpenAIError(str(exc), exc.param) from None
    except SterError as exc:
        raise OpenAIError(str(exc), "steering") from None


def _entry(served: Served, body: Any) -> Registered:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise OpenAIError(
            "name must be 1 to 64 letters, digits, dots, dashes, underscores or colons, starting with a letter or "
            "digit",
            "name",
        )
    kinds = [kind for kind in ("vector", "adapter") if body.get(kind) is not None]
    unknown = sorted(set(body) - {"name", "vector", "adapter"})
    if unknown:
        raise OpenAIError(f"{unknown[0]} is not a field of a registration (name, and vector or adapter)", unknown[0])
    if len(kinds) != 1:
        raise OpenAIError("give exactly one of vector (a steering artifact's path) or adapter (a LoRA's path)")
    kind = kinds[0]
    path = body[kind]
    if not isinstance(path, str) or not path.strip():
        raise OpenAIError(f"{kind} must be a path", kind)
    try:
        if kind == "vector":
            from ster.engine.protocol import confine
            from ster.engine.steering.artifact import load_artifact

            with confine.within(served.root) if served.root is not None else _nothing():
                artifact = load_artifact(served.read_path(path, "vector"))
            return Registered(name, "vector", path, artifact)
        located = served.read_path(path, "adapter")
        if not os.path.exists(located):
            raise Refusal(f"adapter {path} does not exist")
        return Registered(name, "adapter", path)
    except SterError as exc:
        raise OpenAIError(str(exc), kind) from None


def _schema(kind: str) -> dict[str, Any]:
    """The request body in ``/docs``: OpenAI's fields named, and the ``steering`` spec's JSON schema."""
    spec = SteeringSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    from ster.serve.app import BODY_SCHEMAS

    BODY_SCHEMAS.update(spec.pop("$defs", {}))
    BODY_SCHEMAS["SteeringSpec"] = spec
    text = (
        {"messages": {"type": "array", "items": {"type": "object"}}}
        if kind == "chat"
        else {"prompt": {"anyOf": [{"type": "string"}, {"type": "array"}]}}
    )
    properties = {
        "model": {"type": "string"},
        **text,
        "max_tokens": {"type": "integer"},
        "max_completion_tokens": {"type": "integer"},
        "temperature": {"type": "number", "default": 1.0},
        "top_p": {"type": "number"},
        "seed": {"type": "integer"},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "n": {"type": "integer", "default": 1},
        "stream": {"type": "boolean", "default": False},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "logprobs": {"type": "boolean" if kind == "chat" else "integer"},
        "top_logprobs": {"type": "integer"},
        "ignore_eos": {"type": "boolean", "default": False, "description": "vLLM's: decode past EOS to max_tokens."},
        "min_tokens": {"type": "integer", "default": 0, "description": "vLLM's: no EOS before this many tokens."},
        "adapter": {"type": "string", "description": "A LoRA adapter: a path under --root or a registered name."},
        "steering": {
            "description": "Ster's steering spec: a vector's name or path, one intervention, or a list of them.",
            "anyOf": [
                {"type": "string"},
                {"$ref": "#/components/schemas/Intervention"},
                {"type": "array", "items": {"$ref": "#/components/schemas/Intervention"}},
                {"$ref": "#/components/schemas/SteeringSpec"},
            ],
        },
    }
    schema = {"type": "object", "required": ["model"], "properties": properties}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
