"""OpenAI's API on a real ``ster serve`` subprocess, driven by the official ``openai`` client and by raw httpx.

Field names, chunk order, ``[DONE]``, usage counts and error objects are checked on the wire. Each served
text is compared with ``ster generate`` run in this process on the same prompt and steering (an independent
path: one prompt, one decode loop, no batch), for rows sent together with different specs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve.conftest import Server, start_server, stop_server

MODEL = "ster:toy-chat"
QUESTIONS = ["the sea", "a quiet morning", "why do birds sing", "the river is", "tell me about the hill"]


def _artifacts(where: Path) -> None:
    """calm.json fitted on the toy-chat model, anxious.json (the same file with the direction turned around), and two
    LoRA adapters for the toy-chat model."""
    from ster.cli import main
    from tests.tune.adapter_files import write_adapter

    write_adapter(where / "first.safetensors", model=MODEL, b_scale=0.5, seed=1)
    write_adapter(where / "second.safetensors", model=MODEL, b_scale=0.5, seed=2, rank=2, targets=("up", "down"))

    assert (
        main(
            [
                "--json",
                "train",
                "--model",
                MODEL,
                "--pairs",
                "ster:pairs",
                "--layers",
                "1,2",
                "--output",
                str(where / "calm.json"),
            ]
        )
        == 0
    )
    document = json.loads((where / "calm.json").read_text())
    document["trait_name"] = "anxious"
    for vector in document["vectors"]:
        vector["values"] = [-value for value in vector["values"]]
    (where / "anxious.json").write_text(json.dumps(document))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("openai")
    _artifacts(where)
    return where


@pytest.fixture(scope="module")
def server(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    xdg = tmp_path_factory.mktemp("openai-xdg")
    env = {"XDG_DATA_HOME": str(xdg / "data"), "XDG_STATE_HOME": str(xdg / "state")}
    running = start_server(home, "--model", MODEL, env=env)
    yield running
    stop_server(running)
    assert "Traceback" not in running.stderr_text()


def client(server: Server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token or "none", max_retries=0, **kwargs)


def generate(home: Path, question: str, n: int, **steering: str) -> str:
    """``ster generate``'s text, in this process: the independent reference of a served row."""
    from ster.engine.protocol.jobs import build_job_request, run_job

    flags = {"model": MODEL, "prompt": question, "max_new_tokens": str(n), **steering}
    for name in ("vector", "adapter"):
        if name in flags:
            flags[name] = str(home / flags[name])
    final = run_job("generate", build_job_request("generate", **flags), lambda event: None)
    assert final.type == "result", final
    return str(final.data["text"])


def test_models_lists_the_model_loaded_at_start(server: Server) -> None:
    listed = client(server).models.list()
    assert [model.id for model in listed.data] == [MODEL]
    assert listed.data[0].object == "model" and listed.data[0].owned_by == "ster"


def test_a_chat_completion_has_openais_fields_and_the_text_generate_gives(server: Server, home: Path) -> None:
    answer = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "the sea"}], max_tokens=12, temperature=0
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-") and answer.model == MODEL
    choice = answer.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == generate(home, "the sea", 12)
    from ster.engine.protocol.jobs import build_job_request, run_job

    final = run_job(
        "generate",
        build_job_request("generate", **{"model": MODEL, "prompt": "the sea", "max_new_tokens": "12"}),
        lambda e: None,
    )
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == final.data["prompt_tokens"]
    assert answer.usage.completion_tokens == final.data["tokens"]
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert choice.finish_reason == ("length" if final.data["stop_reason"] == "max_new_tokens" else "stop")


def sse(server: Server, path: str, body: dict) -> tuple[int, list[str]]:
    """The raw ``data:`` payloads of a streamed answer, in order (comments left out)."""
    with httpx.Client(base_url=server.url, timeout=60) as raw, raw.stream("POST", path, json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
        return response.status_code, payloads


def test_a_stream_sends_the_role_then_the_text_then_the_reason_then_usage_then_done(server: Server) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a quiet morning"}],
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, payloads = sse(server, "/v1/chat/completions", body)
    assert status == 200 and payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert all(isinstance(t, str) for t in texts)
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
    whole = client(server).chat.completions.create(**{k: v for k, v in body.items() if not k.startswith("stream")})
    assert "".join(texts) == whole.choices[0].message.content
    assert chunks[-1]["usage"] == whole.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})


def test_the_official_client_streams_and_reads_text_completions_with_logprobs(server: Server) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "the river is"}], max_tokens=8, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    whole = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "the river is"}], max_tokens=8, temperature=0
    )
    assert "".join(pieces) == whole.choices[0].message.content
    text = client(server).completions.create(model=MODEL, prompt="the sea is", max_tokens=6, temperature=0, logprobs=3)
    assert text.object == "text_completion" and text.choices[0].logprobs is not None
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    for chosen, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert value <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(value)  # greedy: the best one
        assert chosen in top


SPECS: list[tuple[object, dict[str, str]]] = [
    (None, {}),
    ({"vector": "calm.json", "scale": 4}, {"vector": "calm.json", "strength": "4"}),
    ({"vector": "anxious.json", "scale": "1.5x"}, {"vector": "anxious.json", "strength": "1.5x"}),
    ({"vector": "calm.json", "mode": "ablate"}, {"vector": "calm.json", "mode": "ablate"}),
    ({"vector": "calm.json", "mode": "clamp", "scale": 3}, {"vector": "calm.json", "mode": "clamp", "strength": "3"}),
    (
        {"vector": "calm.json", "scale": -5, "target_layers": [2]},
        {"vector": "calm.json", "strength": "-5", "layers": "2"},
    ),
    (
        {"vector": "calm.json", "mode": "ablate", "peak_layer": 1, "falloff": 1, "min_weight": 0.5},
        {"vector": "calm.json", "mode": "ablate", "peak_layer": "1", "falloff": "1", "min_weight": "0.5"},
    ),
    ("anxious.json", {"vector": "anxious.json"}),
    (None, {"adapter": "first.safetensors"}),
    ({"vector": "calm.json", "scale": 4}, {"vector": "calm.json", "strength": "4", "adapter": "second.safetensors"}),
]


def _extra(spec: object, flags: dict[str, str]) -> dict | None:
    extra: dict = {}
    if spec is not None:
        extra["steering"] = spec
    if "adapter" in flags:
        extra["adapter"] = flags["adapter"]
    return extra or None


def test_requests_with_different_specs_sent_together_each_get_the_text_generate_gives(
    server: Server, home: Path
) -> None:
    """Ten requests at once, each with its own spec (none, add absolute and relative, ablate, clamp, narrowed layers,
    a weight profile, a bare name, an adapter, an adapter and a vector): each text equals ``ster generate`` with the
    same flags."""

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as asynchronous:
            asks = [
                asynchronous.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}],
                    max_tokens=10 + k,
                    temperature=0,
                    extra_body=_extra(spec, flags),
                )
                for k, (spec, flags) in enumerate(SPECS)
            ]
            return [answer.choices[0].message.content or "" for answer in await asyncio.gather(*asks)]

    texts = asyncio.run(ask_all())
    health = httpx.get(f"{server.url}/v1/health").json()
    assert health["batches"][MODEL]["rows"] == 0
    for k, ((_, flags), text) in enumerate(zip(SPECS, texts, strict=True)):
        assert text == generate(home, QUESTIONS[k % len(QUESTIONS)], 10 + k, **flags), f"spec {k}"
    assert len(set(texts)) >= 5, "the specs should steer the rows apart"


def test_a_condition_steers_the_prompts_that_pass_it_and_not_the_others(server: Server, home: Path) -> None:
    """Measured first (threshold −2 passes everything), then a threshold between two prompts' measures: the prompt
    above it is steered, the one below is not, both sent in one request batch."""
    ask = client(server)

    def condition(threshold: float) -> dict:
        return {
            "vector": "anxious.json",
            "scale": 6,
            "condition": {"vector": "calm.json", "layer": 1, "threshold": threshold},
        }

    measures = {}
    for question in QUESTIONS[:4]:
        answer = ask.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
            extra_body={"steering": condition(-2.0)},
        )
        measures[question] = answer.model_extra["ster"]["steering"][0]["condition"][0]["measure"]
    ordered = sorted(measures, key=measures.__getitem__)
    low, high = ordered[0], ordered[-1]
    assert measures[high] - measures[low] > 1e-3
    threshold = (measures[low] + measures[high]) / 2

    async def both() -> list:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as asynchronous:
            return await asyncio.gather(
                *(
                    asynchronous.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": q}],
                        max_tokens=10,
                        temperature=0,
                        extra_body={"steering": condition(threshold)},
                    )
                    for q in (low, high)
                )
            )

    below, above = asyncio.run(both())
    assert below.model_extra["ster"]["steering"][0]["condition"][0]["passed"] is False
    assert above.model_extra["ster"]["steering"][0]["condition"][0]["passed"] is True
    assert below.choices[0].message.content == generate(home, low, 10)
    assert above.choices[0].message.content == generate(home, high, 10, vector="anxious.json", strength="6")


def raw_error(server: Server, path: str, body: object, status: int) -> dict:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"] and error["message"].count("\n") == 0
    return error


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "the sea"}], "max_tokens": 4}


@pytest.mark.parametrize(
    ("change", "status", "param", "words"),
    [
        ({"model": None}, 400, "model", "model is required"),
        ({"model": "no-such-model"}, 404, "model", "no-such-model"),
        ({"messages": []}, 400, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "system, developer, user"),
        ({"temperature": 3}, 400, "temperature", "from 0 to 2"),
        ({"max_tokens": 0}, 400, "max_tokens", "from 1"),
        ({"max_tokens": 10**6}, 400, "max_tokens", "more than the model's context"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "not supported"),
        ({"logit_bias": {"5": 3}}, 400, "logit_bias", "not supported"),
        ({"n": 99}, 400, "n", "from 1 to 16"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "up to 4"),
        ({"steering": {"vector": "calm.json", "scal": 2}}, 400, "steering[0].scal", "not a field"),
        ({"steering": {"vector": "calm.json", "mode": "flip"}}, 400, "steering[0].mode", "'add', 'ablate' or"),
        ({"steering": {"vector": "calm.json", "scale": "lots"}}, 400, "steering[0].scale", '"lots" is not'),
        ({"steering": {"vector": "missing.json"}}, 400, "steering[0].vector", "missing.json"),
        ({"steering": {"vector": "calm.json", "scale": "calibrated"}}, 400, "steering[0].scale", "no calibrated"),
        ({"steering": {"vector": "calm.json", "target_layers": [3]}}, 400, "steering[0]", "layer 3"),
        (
            {"steering": {"vector": "calm.json", "condition": {"vector": "calm.json", "layer": 0, "threshold": 0}}},
            400,
            "steering[0].condition.layer",
            "no direction",
        ),
        ({"adapter": "no-such.safetensors"}, 400, "adapter", "no-such.safetensors"),
        ({"adapter": "calm.json"}, 400, "adapter", "calm.json"),
    ],
)
def test_a_bad_field_is_a_400_in_openais_shape_naming_it(server: Server, change, status, param, words) -> None:
    body = {**CHAT, **change}
    error = raw_error(server, "/v1/chat/completions", {k: v for k, v in body.items() if v is not None}, status)
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_min_tokens_and_ignore_eos_hold_a_row_to_its_length(server: Server) -> None:
    ask = client(server)
    free = ask.completions.create(model=MODEL, prompt="the sea is", max_tokens=60, temperature=0)
    assert free.choices[0].finish_reason == "stop" and free.usage.completion_tokens < 30
    for extra in ({"ignore_eos": True}, {"min_tokens": 60}):
        held = ask.completions.create(model=MODEL, prompt="the sea is", max_tokens=60, temperature=0, extra_body=extra)
        assert held.choices[0].finish_reason == "length" and held.usage.completion_tokens == 60
        assert held.choices[0].text.startswith(free.choices[0].text)


def test_unknown_fields_are_ignored_and_bad_json_is_refused(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json={**CHAT, "user": "u1", "metadata": {"a": "b"}, "store": False}
    )
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]
    assert "not valid JSON" in raw_error(server, "/v1/chat/completions", b"{nope", 400)["message"]


def test_a_bad_spec_while_a_stream_runs_leaves_the_stream_whole(server: Server, home: Path) -> None:
    body = {
        **CHAT,
        "messages": [{"role": "user", "content": "the hill"}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }
    payloads: list[str] = []

    def read() -> None:
        payloads.extend(sse(server, "/v1/chat/completions", body)[1])

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    for _ in range(5):
        raw_error(server, "/v1/chat/completions", {**CHAT, "steering": {"vector": "calm.json", "mode": "x"}}, 400)
    reader.join(60)
    assert payloads[-1] == "[DONE]"
    text = "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-1])
    assert text == generate(home, "the hill", 40)


def test_the_registry_names_vectors_and_a_replacement_leaves_running_requests_alone(server: Server, home: Path) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as raw:
        made = raw.post("/v1/steering", json={"name": "mood", "vector": "calm.json"})
        assert made.status_code == 201 and made.json()["registered"]["trait_name"] == "calm"
        assert [e["name"] for e in raw.get("/v1/steering").json()["data"]] == ["mood"]
        body = {
            **CHAT,
            "messages": [{"role": "user", "content": "the sea"}],
            "max_tokens": 30,
            "temperature": 0,
            "stream": True,
            "steering": {"vector": "mood", "scale": 5},
        }
        with raw.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            first = [next(lines) for _ in range(6)]
            replaced = raw.post("/v1/steering", json={"name": "mood", "vector": "anxious.json"})
            assert replaced.status_code == 200 and replaced.json()["replaced"] is True
            rest = list(lines)
        payloads = [line[6:] for line in [*first, *rest] if line.startswith("data: ")]
        text = "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-1])
        assert text == generate(home, "the sea", 30, vector="calm.json", strength="5")
        after = client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "the sea"}],
            max_tokens=30,
            temperature=0,
            extra_body={"steering": {"vector": "mood", "scale": 5}},
        )
        assert after.choices[0].message.content == generate(home, "the sea", 30, vector="anxious.json", strength="5")
        assert raw.delete("/v1/steering/mood").json() == {"deleted": "mood", "kind": "vector"}
        gone = raw.delete("/v1/steering/mood")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
        bad = raw.post("/v1/steering", json={"name": "../x", "vector": "calm.json"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"
        assert raw.post("/v1/steering", json={"name": "tone", "adapter": "first.safetensors"}).status_code == 201
        toned = client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "the sea"}],
            max_tokens=12,
            temperature=0,
            extra_body={"adapter": "tone"},
        )
        assert toned.choices[0].message.content == generate(home, "the sea", 12, adapter="first.safetensors")
        wrong = raw.post("/v1/chat/completions", json={**CHAT, "steering": "tone"})
        assert wrong.status_code == 400 and "registered as an adapter" in wrong.json()["error"]["message"]
        assert raw.delete("/v1/steering/tone").json() == {"deleted": "tone", "kind": "adapter"}


def test_a_client_that_vanishes_mid_stream_leaves_the_batch_and_the_server_serves_on(server: Server) -> None:
    body = {"model": MODEL, "prompt": "the sea is", "max_tokens": 100, "ignore_eos": True, "stream": True}
    for _ in range(3):
        with (
            httpx.Client(base_url=server.url, timeout=60) as raw,
            raw.stream("POST", "/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            for _ in range(4):
                next(lines)
            assert httpx.get(f"{server.url}/v1/health").json()["batches"][MODEL]["rows"] == 1
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/v1/health").json()["batches"][MODEL]["rows"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(f"{server.url}/v1/health").json()["batches"][MODEL]["rows"] == 0
    answer = client(server).chat.completions.create(**{**CHAT, "temperature": 0})
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_job_and_chat_requests_share_the_model(server: Server, home: Path) -> None:
    """A training job posted among streaming chat requests runs once the rows decoding now finish, and every chat
    answer is whole."""
    results: list[str] = []

    def chat(k: int) -> None:
        answer = client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTIONS[k]}], max_tokens=20, temperature=0
        )
        results.append(answer.choices[0].message.content or "")

    threads = [threading.Thread(target=chat, args=(k,)) for k in range(4)]
    for thread in threads[:2]:
        thread.start()
    status, lines = server.post_lines(
        "/v1/train", {"model": MODEL, "pairs": "ster:pairs", "layers": "1", "output": str(home / "job.json")}
    )
    for thread in threads[2:]:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert status == 200 and lines[-1]["type"] == "result" if "type" in lines[-1] else "error" not in lines[-1]
    assert (home / "job.json").exists() and len(results) == 4 and all(results)


def test_the_token_and_the_root_hold_for_every_new_field(tmp_path: Path, home: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(home / "calm.json", root / "calm.json")
    outside = tmp_path / "outside.json"
    shutil.copy(home / "calm.json", outside)
    for suffix in (".safetensors", ".json"):
        shutil.copy(home / f"first{suffix}", tmp_path / f"away{suffix}")
    token = "0123456789abcdefABCDEF-_.~ghijklmnopqrstuv"
    (tmp_path / "token").write_text(token)
    running = start_server(root, "--root", str(root), "--token-file", str(tmp_path / "token"), "--model", MODEL)
    running.token = token
    try:
        with pytest.raises(openai.AuthenticationError) as denied:
            openai.OpenAI(base_url=f"{running.url}/v1", api_key="wrong", max_retries=0).models.list()
        assert denied.value.status_code == 401 and denied.value.body["code"] == "invalid_api_key"
        assert token not in str(denied.value.body)
        ask = client(running)
        steered = ask.chat.completions.create(
            **{**CHAT, "temperature": 0}, extra_body={"steering": {"vector": "calm.json", "scale": 3}}
        )
        assert steered.choices[0].message.content
        headers = {"authorization": f"Bearer {token}"}
        for body, param in [
            ({**CHAT, "steering": {"vector": str(outside)}}, "steering[0].vector"),
            ({**CHAT, "steering": {"vector": "../outside.json"}}, "steering[0].vector"),
            (
                {**CHAT, "steering": {"vector": "calm.json", "condition": {"vector": str(outside), "threshold": 0}}},
                "steering[0].condition.vector",
            ),
            ({**CHAT, "model": str(tmp_path)}, "model"),
            ({**CHAT, "adapter": str(tmp_path / "away.safetensors")}, "adapter"),
        ]:
            response = httpx.post(f"{running.url}/v1/chat/completions", json=body, headers=headers)
            assert response.status_code in (400, 404), response.text
            error = response.json()["error"]
            assert error["param"] == param and "root" in error["message"], error
        registered = httpx.post(
            f"{running.url}/v1/steering", json={"name": "x", "vector": str(outside)}, headers=headers
        )
        assert registered.status_code == 400 and "root" in registered.json()["error"]["message"]
    finally:
        stop_server(running)
    assert "Traceback" not in running.stderr_text()


def test_the_api_document_describes_the_steering_spec(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert {"SteeringSpec", "Intervention", "Condition"} <= set(schemas)
    intervention = schemas["Intervention"]["properties"]
    for name in ("vector", "mode", "scale", "target_layers", "apply_to", "prefill_trigger_positions", "condition"):
        assert name in intervention, name
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages", "steering", "adapter", "stream"} <= set(body["properties"])
    assert "/v1/steering" in document["paths"] and "/v1/models" in document["paths"]


def test_a_chat_request_that_arrives_while_a_job_holds_the_model_is_told_it_waits(server: Server, home: Path) -> None:
    """An endless SFT job holds the model: a streamed chat request is told so in an SSE comment, and is answered
    whole once the job is cancelled; a job posted while rows decode waits for them, not for rows sent after it."""
    body = {"model": MODEL, "examples": "ster:examples", "epochs": 1_000_000, "output": str(home / "sft.safetensors")}
    with httpx.Client(base_url=server.url, timeout=60) as raw:
        with raw.stream("POST", "/v1/tune/sft?stream=events", json=body) as job:
            job_id = job.headers["x-ster-job"]
            lines = job.iter_lines()
            for line in lines:  # the job has the model once it trains
                if json.loads(line).get("stage") not in ("queue", None):
                    break
            chat = {**CHAT, "temperature": 0, "max_tokens": 12, "stream": True}
            seen: list[str] = []

            def read() -> None:
                with httpx.Client(base_url=server.url, timeout=60) as other:
                    with other.stream("POST", "/v1/chat/completions", json=chat) as response:
                        seen.extend(response.iter_lines())

            reader = threading.Thread(target=read)
            reader.start()
            deadline = time.monotonic() + 20
            while not any(line.startswith(": waiting") for line in seen) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any(line.startswith(": waiting") for line in seen), seen
            early = [json.loads(line[6:]) for line in list(seen) if line.startswith("data: {")]
            assert all(not chunk["choices"][0]["delta"].get("content") for chunk in early)  # the role, no text yet
            assert raw.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
            for _ in lines:
                pass
        reader.join(60)
    payloads = [line[6:] for line in seen if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    text = "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads[:-1])
    assert text == generate(home, "the sea", 12)
    assert not (home / "sft.safetensors").exists()
