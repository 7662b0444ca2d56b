"""The wire of ``ster serve`` and ``ster request``: operations, request bodies, and the stream's lines.

Both consumers share this module, so a body means the same thing over HTTP and on stdin:

* an **operation** is a job's command path with ``/`` for spaces (``train``, ``pairs/inspect``,
  ``tune/sft``, ``workspace/import-pairs``); ``ster serve`` exposes it at ``POST /v1/<operation>``;
* a **body** is one JSON object whose fields are the command's flags in camelCase (``chatTemplate``,
  ``maxNewTokens``), each defaulting to what the CLI defaults to. Unknown fields are ignored, an
  empty body is ``{}``, and the fields a job cannot run without are checked first, in order, each
  refused in the original's sentence (``train requires a model``). Then the job's own request
  model checks every value, exactly as for the command line;
* the **default stream** is the original's: every progress line, warning and error the CLI would
  print on stderr as ``{"chunk": …, "stream": "stderr", "type": "log"}``, then one
  ``{"json": …, "status": 0|1, "type": "result"}``, one compact JSON object per line with its keys
  in alphabetical order. The **typed stream** is the project's own events, exactly as
  ``ster --json`` prints them.

Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ster.engine.protocol.errors import SterError
from ster.engine.protocol.events import Error, Event, Log, Progress, Result, Token, Warning
from ster.engine.protocol.jobs import JOBS, build_job_request, request_class

BODY_LIMIT = 1 << 20
"""The largest body either consumer reads: 1 MiB."""

NOT_JSON = "request body is not valid JSON"
TOO_LARGE = "request body too large"

OPERATIONS: dict[str, str] = {name.replace(" ", "/"): name for name in JOBS}
"""Operation (``tune/sft``) → job name (``tune sft``): every job the engine registers."""

UNQUEUED = frozenset(
    {
        "inspect",
        "pairs inspect",
        "pairs save",
        "pairs add",
        "pairs remove",
        "tune inspect",
        "tune export-peft",
        "workspace show",
        "workspace select",
        "workspace remove",
        "workspace import-pairs",
        "onboarding",
    }
)
"""Jobs that never load a model: they run at once, beside a model job, unless their request names a model."""

_PHRASES = {
    "model": "a model",
    "pairs": "a pairs file",
    "output": "an output path",
    "vector": "a steering artifact",
    "prompt": "a prompt",
    "input": "a prompt input file",
    "artifact": "a steering artifact",
    "examples": "an example set",
    "prompts": "a prompt set",
    "adapter": "an adapter",
    "trait": "a trait description",
    "gguf": "a GGUF file",
    "source": "a source file",
    "id": "a set id",
    "positive": "a positive text",
    "negative": "a negative text",
    "index": "a pair index",
    "count": "a pair count above zero",
    "reward": "a reward source",
}
"""How a missing field is named in "<operation> requires <phrase>"."""

_OVERRIDES = {
    ("tune merge", "output"): "an output directory",
    ("tune export-peft", "output"): "an output directory",
    ("tune inspect", "artifact"): "an adapter artifact",
    ("tune evaluate", "examples"): "an example set",
    ("pairs synthesize", "model"): "a model",
}

_ORDER = (
    "model",
    "trait",
    "prompt",
    "pairs",
    "vector",
    "input",
    "examples",
    "prompts",
    "reward",
    "artifact",
    "adapter",
    "source",
    "gguf",
    "id",
    "positive",
    "negative",
    "index",
    "count",
)
"""Required fields are checked in this order, then any other, then ``output`` last."""

_WORKSPACE_PAIRS = frozenset({"train", "optimize", "evaluate", "tune dpo", "tune reward"})
"""Jobs whose pair set falls back to the workspace's active set: required only when there is none."""


class WireRefusal(SterError):
    """A body refused before any job starts: HTTP 400 for ``ster serve``, exit 2 for ``ster request``."""

    kind = "refused"


@dataclass(frozen=True)
class Prepared:
    """A body made into a job: its name and its validated request."""

    operation: str
    job: str
    request: BaseModel
    fields: dict[str, Any]


def snake(name: str) -> str:
    """``maxNewTokens`` → ``max_new_tokens``; a name already in snake case is kept."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def camel(name: str) -> str:
    """``max_new_tokens`` → ``maxNewTokens``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def parse_body(raw: bytes) -> dict[str, Any]:
    """One JSON object from a body; blank means ``{}``. Anything else is refused in one sentence."""
    if len(raw) > BODY_LIMIT:
        raise WireRefusal(TOO_LARGE)
    text = raw.decode("utf-8", errors="strict") if raw else ""
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except ValueError as exc:  # malformed, or a number of more digits than Python converts
        raise WireRefusal(f"{NOT_JSON}: {exc}") from None
    except RecursionError:
        raise WireRefusal(f"{NOT_JSON}: its arrays or objects nest too deeply to be read") from None
    if not isinstance(body, dict):
        raise WireRefusal(f"{NOT_JSON}: expected an object, got {type(body).__name__}")
    return body


def job_for(operation: str) -> str:
    """The job an operation runs; an unknown one is refused."""
    job = OPERATIONS.get(operation.strip("/"))
    if job is None:
        raise WireRefusal(f"unknown operation: {operation}")
    return job


def fields_of(job: str, body: dict[str, Any]) -> dict[str, Any]:
    """The job's request fields from a camelCase body: renamed, unknown ones dropped, wire shapes mapped."""
    fields = {snake(key): value for key, value in body.items()}
    if job == "pairs save":  # the wire's {output, traitName, entries} is the editor's {pairs, pair_set}
        if "pair_set" not in fields and ("entries" in fields or "trait_name" in fields):
            fields["pair_set"] = {"trait_name": fields.get("trait_name") or "", "pairs": fields.get("entries") or []}
        if "pairs" not in fields and "output" in fields:
            fields["pairs"] = fields["output"]
    if job == "tune inspect" and "artifact" not in fields and "adapter" in fields:
        fields["artifact"] = fields["adapter"]
    known = request_class(job).model_fields
    if job == "workspace import-pairs":  # the one body that refuses what it does not know, as in the original
        unknown = [key for key in body if snake(key) not in known]
        if unknown:
            raise WireRefusal(f"workspace import-pairs takes source and name; unknown field {unknown[0]}")
    return {key: value for key, value in fields.items() if key in known}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _requires(job: str, field: str) -> str:
    phrase = _OVERRIDES.get((job, field)) or _PHRASES.get(field) or f"a value for {camel(field)}"
    return f"{job} requires {phrase}"


def check_required(job: str, fields: dict[str, Any]) -> None:
    """Refuse the first missing field a job cannot run without, in the original's order and words."""
    if job == "pairs save":
        if _missing(fields.get("pairs")):
            raise WireRefusal("pairs save requires an output path")
        pair_set = fields.get("pair_set")
        if not isinstance(pair_set, dict) or not pair_set.get("pairs"):
            raise WireRefusal("pairs save requires at least one pair")
        return
    model = request_class(job).model_fields
    required = [name for name, info in model.items() if info.is_required()]
    if job in _WORKSPACE_PAIRS and _missing(fields.get("pairs")) and not _active_set():
        required.append("pairs")
    if job == "tune evaluate" and _missing(fields.get("examples")) and _missing(fields.get("pairs")):
        required.append("examples")
    if job == "pairs inspect" and _missing(fields.get("pairs")) and fields.get("pair_set") is None:
        required.append("pairs")
    rank = {name: i for i, name in enumerate(_ORDER)}
    for name in sorted(dict.fromkeys(required), key=lambda n: (n == "output", rank.get(n, len(rank)))):
        if _missing(fields.get(name)):
            raise WireRefusal(_requires(job, name))
    if job == "pairs synthesize":
        _check_synthesize(fields)


def _check_synthesize(fields: dict[str, Any]) -> None:
    count = fields.get("count")
    if isinstance(count, int | float) and count <= 0:
        raise WireRefusal("pairs synthesize requires a pair count above zero")
    generator = fields.get("generator", "local")
    if generator not in ("local", "brama"):
        raise WireRefusal("unknown generator; expected local or brama")
    if generator == "brama" and _missing(fields.get("generator_model")):
        raise WireRefusal("pairs synthesize with the brama generator requires generatorModel")
    if generator == "local" and _missing(fields.get("model")):
        raise WireRefusal("pairs synthesize requires a model")


def _active_set() -> bool:
    from ster.engine.pairs.workspace import active_pairs

    try:
        active_pairs()
    except SterError:
        return False
    return True


def prepare(operation: str, body: dict[str, Any], root: Any = None) -> Prepared:
    """Check a body for an operation and build its validated request; every refusal is a :class:`WireRefusal`.

    With a server's ``root`` (:class:`ster.serve.guard.Root`), every path the body names is checked to lie
    inside it first, before the request model (whose checks look at the files) sees them.
    """
    job = job_for(operation)
    fields = fields_of(job, body)
    check_required(job, fields)
    if root is not None:
        root.check_fields(job, fields)
    try:
        request = build_job_request(job, **fields)
    except SterError as exc:
        raise WireRefusal(str(exc)) from None
    return Prepared(operation.strip("/"), job, request, fields)


def line(document: dict[str, Any]) -> bytes:
    """One NDJSON line: compact, keys in alphabetical order, UTF-8."""
    return (json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def log_line(text: str) -> bytes:
    return line({"chunk": text + "\n", "stream": "stderr", "type": "log"})


def result_line(document: dict[str, Any], status: int) -> bytes:
    return line({"json": document, "status": status, "type": "result"})


def wire_result(job: str, data: dict[str, Any]) -> dict[str, Any]:
    """A result document in the original's wire shape where it differs from the CLI's."""
    if job == "generate":
        return {"text": data.get("text", "")}
    if job == "extract":
        return {"path": data.get("output")}
    if job == "pairs save":
        return {"pairCount": data.get("pair_count"), "path": data.get("pairs")}
    if job == "pairs synthesize":
        return {"path": data.get("output"), "report": data}
    return data


def import_report(event: Error) -> dict[str, Any]:
    """A refused workspace import as the original reports it: a report with its status, not a failure."""
    details = dict(event.details or {})
    return {**details, "status": details.get("status", "rejected"), "reason": event.message}


def final_status(job: str, event: Event) -> int:
    """The status the default stream's last line gives a final event: 0 done, 1 failed."""
    if event.type == "result":
        return 0
    if job == "workspace import-pairs" and isinstance(event, Error) and event.kind == "refused":
        return 0  # a conflicting or rejected import is a report with status 0, as in the original
    return 1


def default_lines(job: str, event: Event) -> list[bytes]:
    """The original's lines for one event: progress, warnings and errors as stderr chunks, then the result."""
    if isinstance(event, Token):
        return []
    if isinstance(event, Progress | Log):
        return [log_line(event.message)]
    if isinstance(event, Warning):
        return [log_line(f"warning: {event.message}")]
    if isinstance(event, Result):
        return [result_line(wire_result(job, event.data), 0)]
    assert isinstance(event, Error)
    if final_status(job, event) == 0:
        return [log_line(event.message), result_line(import_report(event), 0)]
    return [log_line(f"error: {event.message}"), result_line({"error": event.message}, 1)]


def typed_lines(job: str, event: Event) -> list[bytes]:
    """The project's own event, as ``ster --json`` prints it."""
    return [(event.to_json() + "\n").encode()]


def queue_event(ahead: int) -> Progress:
    """What a request waiting for the model is told: how many jobs are ahead of it."""
    jobs = "1 job" if ahead == 1 else f"{ahead} jobs"
    return Progress(stage="queue", current=ahead, message=f"waiting for the model: {jobs} ahead of this one")
