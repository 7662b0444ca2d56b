"""``ster serve`` as a client sees it: a real server on 127.0.0.1 (port 0) in a subprocess, driven with httpx.

Every endpoint runs on the toy and its result is compared with what the CLI prints for the same
flags; every refusal sentence of the contract is checked; both stream formats; the queue; a
client that goes away cancels its job; the token and ``--root`` rules off loopback.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from ster.engine.protocol.events import parse_event
from ster.serve import wire
from tests.serve.conftest import RIVER, TOY, Server, start_server, stop_server

LONG_SFT = {"model": TOY, "examples": "ster:examples", "epochs": 5000}
"""A toy job that runs for minutes unless cancelled (an epoch takes tens of milliseconds)."""


def result_of(lines: list[dict]) -> dict:
    assert lines and lines[-1]["type"] == "result", lines[-3:]
    assert [line["type"] for line in lines[:-1]] == ["log"] * (len(lines) - 1)
    return lines[-1]


def wait_idle(server: Server, timeout: float = 60.0) -> dict:
    """Poll health until no job holds the model or waits for it; return the last health document."""
    deadline = time.monotonic() + timeout
    with server.client() as client:
        while True:
            health = client.get("/v1/health").json()
            if (health["running"] == 0 and health["queued"] == 0) or time.monotonic() > deadline:
                return health
            time.sleep(0.05)


# --- results --------------------------------------------------------------------------------------


def test_health_and_ready_line(server: Server) -> None:
    with server.client() as client:
        response = client.get("/v1/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_generate_streams_the_original_lines_and_equals_the_cli(server: Server, cli) -> None:
    status, lines = server.post_lines("/v1/generate", {"model": TOY, "prompt": RIVER, "maxNewTokens": 6})
    assert status == 200
    result = result_of(lines)
    local = cli("generate", "--model", TOY, "--prompt", RIVER, "--max-new-tokens", "6")
    assert result == {"json": {"text": local.json["text"]}, "status": 0, "type": "result"}
    assert any("generating up to 6 tokens" in line["chunk"] for line in lines[:-1])
    assert all(line["stream"] == "stderr" and line["chunk"].endswith("\n") for line in lines[:-1])


def test_lines_are_compact_with_keys_in_order(server: Server) -> None:
    with server.client() as client:
        response = client.post("/v1/generate", json={"model": TOY, "prompt": RIVER, "maxNewTokens": 2})
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["cache-control"] == "no-cache"
    for raw in response.text.splitlines():
        parsed = json.loads(raw)
        assert raw == json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_typed_stream_is_what_ster_json_prints(server: Server, cli) -> None:
    body = {"model": TOY, "prompt": RIVER, "maxNewTokens": 5}
    for kwargs in ({"params": {"stream": "events"}}, {"headers": {"accept": "application/vnd.ster.events+x-ndjson"}}):
        with server.client() as client:
            response = client.post("/v1/generate", json=body, **kwargs)
        events = [parse_event(line) for line in response.text.splitlines()]
        local = cli("--json", "generate", "--model", TOY, "--prompt", RIVER, "--max-new-tokens", "5").events
        tokens = [e.text for e in events if e.type == "token"]
        assert tokens == [e["text"] for e in local if e["type"] == "token"] and len(tokens) == 5
        assert events[-1].type == "result" and events[-1].data["text"] == "".join(tokens)
        assert events[-1].data["text"] == local[-1]["data"]["text"]


def test_camel_case_fields_defaults_and_unknown_fields(server: Server) -> None:
    status, lines = server.post_lines(
        "/v1/generate",
        {"model": TOY, "prompt": RIVER, "maxNewTokens": 3, "chatTemplate": "off", "somethingNew": [1, 2]},
    )
    assert status == 200 and result_of(lines)["status"] == 0
    status, typed = server.post_lines(
        "/v1/generate?stream=events",
        {"model": TOY, "prompt": RIVER, "maxNewTokens": 3, "temperature": 0.7, "topP": 0.9, "seed": 3},
    )
    data = typed[-1]["data"]
    assert (data["temperature"], data["top_p"], data["seed"], data["precision"]) == (0.7, 0.9, 3, "f32")


def test_steering_endpoints_equal_the_cli(server: Server, cli, tmp_path: Path) -> None:
    artifact = tmp_path / "wire.ster.json"
    status, lines = server.post_lines(
        "/v1/train",
        {
            "model": TOY,
            "pairs": "ster:pairs",
            "output": str(artifact),
            "method": "caa",
            "layers": "1..3",
            "batchSize": 4,
        },
    )
    summary = result_of(lines)["json"]
    local = cli(
        "train",
        "--model",
        TOY,
        "--pairs",
        "ster:pairs",
        "--output",
        str(tmp_path / "cli.ster.json"),
        "--layers",
        "1..3",
        "--batch-size",
        "4",
    ).json
    written = json.loads((tmp_path / "cli.ster.json").read_text())
    assert json.loads(artifact.read_text())["vectors"] == written["vectors"]
    assert summary["layers"] == local["layers"] and [row["layer"] for row in summary["layers"]] == [1, 2]

    status, lines = server.post_lines(
        "/v1/optimize", {"model": TOY, "pairs": "ster:pairs", "output": str(tmp_path / "opt.ster.json")}
    )
    assert (
        result_of(lines)["json"]["selection"]
        == cli("optimize", "--model", TOY, "--pairs", "ster:pairs", "--output", str(tmp_path / "opt2.ster.json")).json[
            "selection"
        ]
    )

    lines = server.post_lines("/v1/evaluate", {"model": TOY, "pairs": "ster:pairs", "vector": str(artifact)})[1]
    local = cli("evaluate", "--model", TOY, "--pairs", "ster:pairs", "--vector", str(artifact)).json
    assert result_of(lines)["json"] == local

    lines = server.post_lines("/v1/inspect", {"artifact": str(artifact)})[1]
    assert result_of(lines)["json"] == cli("inspect", str(artifact)).json

    out = tmp_path / "acts.json"
    lines = server.post_lines("/v1/extract", {"model": TOY, "input": "ster:prompts", "output": str(out)})[1]
    assert result_of(lines)["json"] == {"path": str(out)} and out.exists()

    lines = server.post_lines(
        "/v1/sweep",
        {"model": TOY, "vector": str(artifact), "promptTexts": [RIVER], "strengths": ["0.4x"], "maxNewTokens": 4},
    )[1]
    assert len(result_of(lines)["json"]["rows"]) == 2

    lines = server.post_lines(
        "/v1/generate", {"model": TOY, "prompt": RIVER, "vector": str(artifact), "strength": "0.4x", "maxNewTokens": 6}
    )[1]
    steered = cli(
        "generate",
        "--model",
        TOY,
        "--prompt",
        RIVER,
        "--vector",
        str(artifact),
        "--strength",
        "0.4x",
        "--max-new-tokens",
        "6",
    ).json["text"]
    assert result_of(lines)["json"] == {"text": steered}

    body = {"model": TOY, "prompt": RIVER, "vector": str(artifact), "mode": "ablate", "peakLayer": 2, "falloff": 1}
    lines = server.post_lines("/v1/generate", {**body, "maxNewTokens": 6})[1]
    ablated = cli(
        "generate",
        "--model",
        TOY,
        "--prompt",
        RIVER,
        "--vector",
        str(artifact),
        "--mode",
        "ablate",
        "--peak-layer",
        "2",
        "--falloff",
        "1",
        "--max-new-tokens",
        "6",
    ).json
    assert ablated["mode"] == "ablate" and set(ablated["edits"]) == {"1", "2", "3"}
    assert result_of(lines)["json"] == {"text": ablated["text"]}
    status, refused = server.post_lines("/v1/generate", {**body, "strength": "0.4x"})
    assert status == 400 and "is not a weight: with --mode ablate" in str(refused), refused


def test_pair_endpoints(server: Server, tmp_path: Path) -> None:
    saved = tmp_path / "mine.json"
    entries = [
        {"positive": "calm river", "negative": "alarmed river"},
        {"positive": "calm sea", "negative": "alarmed sea"},
    ]
    lines = server.post_lines("/v1/pairs/save", {"traitName": "calm", "entries": entries, "output": str(saved)})[1]
    assert result_of(lines)["json"] == {"pairCount": 2, "path": str(saved)}
    assert json.loads(saved.read_text())["pairs"] == entries

    lines = server.post_lines("/v1/pairs/inspect", {"pairs": str(saved)})[1]
    assert result_of(lines)["json"]["pair_count"] == 2

    lines = server.post_lines("/v1/workspace/import-pairs", {"source": str(saved), "name": "mine"})[1]
    assert result_of(lines)["status"] == 0 and result_of(lines)["json"]["status"] == "imported"
    # a conflicting or rejected import is a report with status 0, as in the original
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"trait_name": "calm", "pairs": entries[:1]}))
    conflict = result_of(server.post_lines("/v1/workspace/import-pairs", {"source": str(other), "name": "mine"})[1])
    assert conflict["status"] == 0 and conflict["json"]["status"] == "conflicting"
    assert conflict["json"]["reason"].startswith("conflicting: the workspace already keeps")
    (tmp_path / "bad.json").write_text("{}")
    rejected = result_of(server.post_lines("/v1/workspace/import-pairs", {"source": str(tmp_path / "bad.json")})[1])
    assert rejected["status"] == 0 and rejected["json"]["status"] == "rejected"
    with server.client() as client:
        response = client.post("/v1/workspace/import-pairs", json={"source": str(saved), "extra": 1})
    assert response.json() == {"error": "workspace import-pairs takes source and name; unknown field extra"}
    with server.client() as client:
        shown = client.get("/v1/workspace").json()
    assert shown["active"] == "mine" and [s["id"] for s in shown["sets"]] == ["mine"]
    # with an active set, train needs no pairs field
    lines = server.post_lines("/v1/train", {"model": TOY, "output": str(tmp_path / "active.ster.json")})[1]
    assert result_of(lines)["json"]["trait_name"] == "calm"
    lines = server.post_lines("/v1/workspace/remove", {"id": "mine"})[1]
    assert result_of(lines)["status"] == 0

    out = tmp_path / "synth.json"
    lines = server.post_lines(
        "/v1/pairs/synthesize", {"model": TOY, "trait": "calm", "count": 1, "output": str(out), "maxNewTokens": 8}
    )[1]
    result = result_of(lines)
    if result["status"] == 0:
        assert result["json"]["path"] == str(out) and result["json"]["report"]["requested"] == 1
    else:  # the toy may fail to write a usable pair; the job still ends with one sentence
        assert result["json"]["error"] and lines[-2]["chunk"].startswith("error: ")


def test_tune_endpoints(server: Server, cli, tmp_path: Path) -> None:
    adapter = tmp_path / "sft.safetensors"
    lines = server.post_lines(
        "/v1/tune/sft", {"model": TOY, "examples": "ster:examples", "output": str(adapter), "epochs": 1, "seed": 7}
    )[1]
    result = result_of(lines)["json"]
    assert result["path"] == str(adapter) and result["report"]["trainable_tensors"] == 16
    local = tmp_path / "cli.safetensors"
    cli(
        "tune",
        "sft",
        "--model",
        TOY,
        "--examples",
        "ster:examples",
        "--output",
        str(local),
        "--epochs",
        "1",
        "--seed",
        "7",
    )
    assert adapter.read_bytes() == local.read_bytes()

    dpo = result_of(
        server.post_lines(
            "/v1/tune/dpo",
            {"model": TOY, "pairs": "ster:pairs", "epochs": 1, "output": str(tmp_path / "dpo.safetensors")},
        )[1]
    )["json"]
    assert dpo["report"]["first_loss"] == pytest.approx(0.693147, abs=1e-5)
    reward = result_of(
        server.post_lines(
            "/v1/tune/reward",
            {"model": TOY, "pairs": "ster:pairs", "epochs": 1, "output": str(tmp_path / "rm.safetensors")},
        )[1]
    )["json"]
    assert reward["report"]["first_loss"] == pytest.approx(0.693147, abs=1e-5)
    grpo = result_of(
        server.post_lines(
            "/v1/tune/grpo",
            {
                "model": TOY,
                "prompts": "ster:grpo-prompts",
                "group": 2,
                "maxNewTokens": 4,
                "output": str(tmp_path / "grpo.safetensors"),
            },
        )[1]
    )["json"]
    assert grpo["report"]["first_loss"] == 0

    evaluated = result_of(
        server.post_lines("/v1/tune/evaluate", {"model": TOY, "examples": "ster:examples", "adapter": str(adapter)})[1]
    )["json"]
    assert (
        evaluated
        == cli("tune", "evaluate", "--model", TOY, "--examples", "ster:examples", "--adapter", str(adapter)).json
    )
    inspected = result_of(server.post_lines("/v1/tune/inspect", {"adapter": str(adapter)})[1])["json"]
    assert inspected == cli("tune", "inspect", str(adapter)).json
    merged = tmp_path / "merged"
    result = result_of(
        server.post_lines("/v1/tune/merge", {"model": TOY, "adapter": str(adapter), "output": str(merged)})[1]
    )
    assert result["status"] == 0 and (merged / "config.json").exists()
    peft = tmp_path / "peft"
    result = result_of(server.post_lines("/v1/tune/export-peft", {"adapter": str(adapter), "output": str(peft)})[1])
    assert result["status"] == 0 and (peft / "adapter_config.json").exists()


def test_a_failure_while_running_ends_with_status_1(server: Server, tmp_path: Path) -> None:
    status, lines = server.post_lines("/v1/inspect", {"artifact": str(tmp_path / "missing.json")})
    assert status == 200
    assert lines[-2]["chunk"].startswith("error: ") and lines[-2]["chunk"].endswith("\n")
    assert lines[-1]["status"] == 1 and lines[-1]["json"]["error"] == lines[-2]["chunk"][7:-1]


# --- refusals -------------------------------------------------------------------------------------

REQUIRED = [
    ("train", {}, "train requires a model"),
    ("train", {"model": TOY}, "train requires a pairs file"),
    ("train", {"model": TOY, "pairs": "ster:pairs"}, "train requires an output path"),
    ("evaluate", {"model": TOY, "pairs": "ster:pairs"}, "evaluate requires a steering artifact"),
    ("generate", {"model": TOY}, "generate requires a prompt"),
    ("extract", {"model": TOY, "output": "x.json"}, "extract requires a prompt input file"),
    ("inspect", {}, "inspect requires a steering artifact"),
    ("pairs/inspect", {}, "pairs inspect requires a pairs file"),
    ("pairs/save", {"entries": [{"positive": "a", "negative": "b"}]}, "pairs save requires an output path"),
    ("pairs/save", {"output": "x.json", "entries": []}, "pairs save requires at least one pair"),
    (
        "pairs/synthesize",
        {"count": 2, "output": "x.json", "model": TOY},
        "pairs synthesize requires a trait description",
    ),
    ("pairs/synthesize", {"trait": "calm", "count": 2, "model": TOY}, "pairs synthesize requires an output path"),
    (
        "pairs/synthesize",
        {"trait": "calm", "count": 0, "output": "x.json", "model": TOY},
        "pairs synthesize requires a pair count above zero",
    ),
    (
        "pairs/synthesize",
        {"trait": "calm", "count": 2, "output": "x.json", "generator": "brama"},
        "pairs synthesize with the brama generator requires generatorModel",
    ),
    (
        "pairs/synthesize",
        {"trait": "calm", "count": 2, "output": "x.json", "generator": "other"},
        "unknown generator; expected local or brama",
    ),
    ("pairs/synthesize", {"trait": "calm", "count": 2, "output": "x.json"}, "pairs synthesize requires a model"),
    ("tune/sft", {}, "tune sft requires a model"),
    ("tune/sft", {"model": TOY}, "tune sft requires an example set"),
    ("tune/sft", {"model": TOY, "examples": "ster:examples"}, "tune sft requires an output path"),
    ("tune/dpo", {"model": TOY, "output": "a.safetensors"}, "tune dpo requires a pairs file"),
    ("tune/grpo", {"model": TOY, "output": "a.safetensors"}, "tune grpo requires a prompt set"),
    ("tune/merge", {"model": TOY, "output": "m"}, "tune merge requires an adapter"),
    ("tune/merge", {"model": TOY, "adapter": "a.safetensors"}, "tune merge requires an output directory"),
    ("tune/evaluate", {"model": TOY}, "tune evaluate requires an example set"),
    ("tune/inspect", {}, "tune inspect requires an adapter artifact"),
]


def test_every_required_field_sentence(server: Server) -> None:
    with server.client() as client:
        for operation, body, sentence in REQUIRED:
            response = client.post(f"/v1/{operation}", json=body)
            assert (response.status_code, response.json()) == (400, {"error": sentence}), operation


def test_bodies_refused_before_any_job(server: Server, tmp_path: Path) -> None:
    with server.client() as client:
        before = client.get("/v1/health").json()["jobs"]["accepted"]
        cases = [
            (b'{"model":', "request body is not valid JSON"),
            (b"[1, 2]", "request body is not valid JSON"),
            (b"\xff\xfe{}", "request body is not valid JSON"),
            (b"x" * (wire.BODY_LIMIT + 1), "request body too large"),
            (
                json.dumps({"model": TOY, "prompt": "a", "maxNewTokens": "many"}).encode(),
                '--max-new-tokens must be a whole number; got "many"',
            ),
            (
                json.dumps({"model": TOY, "prompt": "a", "precision": "f64"}).encode(),
                "--precision must be 'f32', 'f16', 'bf16' or 'int8'",
            ),
        ]
        for body, sentence in cases:
            response = client.post("/v1/generate", content=body)
            assert response.status_code == 400 and response.json()["error"].startswith(sentence), body[:30]
        output = tmp_path / "never.json"
        response = client.post(
            "/v1/train", json={"model": TOY, "pairs": "ster:pairs", "output": str(output), "batchSize": 0}
        )
        assert response.status_code == 400 and not output.exists()
        # an empty body is {}: the first required field is what is missing
        assert client.post("/v1/generate", content=b"").json() == {"error": "generate requires a model"}
        assert client.get("/v1/health").json()["jobs"]["accepted"] == before


def test_unknown_routes_are_404_with_a_sentence(server: Server) -> None:
    with server.client() as client:
        for method, path in (("GET", "/v1/nope"), ("POST", "/v1/tune/nope"), ("GET", "/v1/train"), ("DELETE", "/")):
            response = client.request(method, path)
            assert (response.status_code, response.json()) == (404, {"error": f"unknown endpoint: {method} {path}"})


def test_openapi_documents_every_operation_in_camel_case(server: Server) -> None:
    with server.client() as client:
        document = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
    for operation in wire.OPERATIONS:
        assert f"/v1/{operation}" in document["paths"], operation
    schema = document["paths"]["/v1/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"maxNewTokens", "chatTemplate", "topP", "prompt"} <= set(schema["properties"])


# --- the queue and cancellation -------------------------------------------------------------------


def test_a_waiting_job_is_told_its_place_and_a_vanished_client_cancels_its_job(server: Server, tmp_path: Path) -> None:
    wait_idle(server)
    with server.client() as client:
        cancelled_before = client.get("/v1/health").json()["jobs"]["cancelled"]
    long_out = tmp_path / "long.safetensors"
    first = server.client()
    stream = first.stream("POST", "/v1/tune/sft", json={**LONG_SFT, "output": str(long_out)})
    response = stream.__enter__()
    lines = response.iter_lines()
    assert "resolving model" in json.loads(next(lines))["chunk"]
    with server.client() as client:  # the long job holds the model
        deadline = time.monotonic() + 30
        while client.get("/v1/health").json()["running"] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/v1/health").json()["running"] == 1
        with client.stream("POST", "/v1/generate", json={"model": TOY, "prompt": RIVER, "maxNewTokens": 3}) as waiting:
            waiting_lines = waiting.iter_lines()
            assert json.loads(next(waiting_lines))["chunk"] == "waiting for the model: 1 job ahead of this one\n"
            assert client.get("/v1/health").json()["queued"] == 1
            stream.__exit__(None, None, None)  # the first client goes away mid-stream
            first.close()
            rest = [json.loads(line) for line in waiting_lines]
    assert rest[-1] == {"json": {"text": "the river is"}, "status": 0, "type": "result"}
    health = wait_idle(server)
    assert health["jobs"]["cancelled"] == cancelled_before + 1
    assert not long_out.exists()


def test_a_queued_client_that_goes_away_gives_up_its_place(server: Server, tmp_path: Path) -> None:
    wait_idle(server)
    holder = server.client()
    with holder.stream("POST", "/v1/tune/sft", json={**LONG_SFT, "output": str(tmp_path / "a.safetensors")}) as held:
        lines = held.iter_lines()
        next(lines)
        with server.client() as client:
            with client.stream(
                "POST", "/v1/train", json={"model": TOY, "pairs": "ster:pairs", "output": str(tmp_path / "never.json")}
            ) as queued:
                assert "waiting for the model" in json.loads(next(queued.iter_lines()))["chunk"]
            deadline = time.monotonic() + 10
            while client.get("/v1/health").json()["queued"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.get("/v1/health").json()["queued"] == 0
            job_id = held.headers["x-ster-job"]
            assert client.post(f"/v1/jobs/{job_id}/cancel").json() == {"cancelled": job_id}
        rest = [json.loads(line) for line in lines]
    holder.close()
    assert rest[-1]["status"] == 1 and "cancelled" in rest[-1]["json"]["error"]
    assert not (tmp_path / "never.json").exists()
    with server.client() as client:
        assert client.post("/v1/jobs/nope/cancel").status_code == 404


def test_models_stay_loaded_between_requests(server: Server) -> None:
    body = {"model": TOY, "prompt": RIVER, "maxNewTokens": 2}
    server.post_lines("/v1/generate", body)
    lines = server.post_lines("/v1/generate", body)[1]
    assert not any(line["chunk"].startswith("loading ster:toy weights") for line in lines[:-1])


# --- off loopback: the token and the root ---------------------------------------------------------


def test_off_loopback_needs_a_token_and_a_root(tmp_path: Path) -> None:
    for args, sentence in (
        (["--host", "0.0.0.0"], "requires a bearer token"),
        (["--host", "0.0.0.0", "--token-file", str(_token(tmp_path))], "requires --root DIR"),
    ):
        with pytest.raises(AssertionError, match=sentence):
            start_server(tmp_path, *args, env={"STER_SERVE_TOKEN": ""})
    taken = start_server(tmp_path)
    try:
        port = taken.url.rsplit(":", 1)[1]
        with pytest.raises(AssertionError, match="failed to bind the serve port"):
            start_server(tmp_path, "--port", port)
    finally:
        stop_server(taken)


TOKEN = "s3cret-0123456789abcdef0123456789abcdef"
"""A token strong enough for a server: 38 characters, more than 8 of them different."""


def _token(directory: Path, token: str = TOKEN) -> Path:
    path = directory / "token"
    path.write_text(token + "\n")
    return path


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("guarded")
    root = base / "root"
    root.mkdir()
    home = tmp_path_factory.mktemp("guarded-xdg")
    env = {"XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state")}
    server = start_server(base, "--host", "0.0.0.0", "--token-file", str(_token(base)), "--root", str(root), env=env)
    server.token = TOKEN
    server.url = server.url.replace("0.0.0.0", "127.0.0.1")
    yield server, root, base
    stop_server(server)
    assert "s3cret" not in server.stderr_text()  # the token is never logged


def test_the_token_is_required_and_never_echoed(guarded) -> None:
    server, root, _ = guarded
    body = {"model": TOY, "prompt": RIVER, "maxNewTokens": 2}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        response = httpx.post(f"{server.url}/v1/generate", json=body, headers=headers)
        assert response.status_code == 401 and "s3cret" not in response.text
        assert response.json()["error"].startswith("this server requires a bearer token")
    assert httpx.get(f"{server.url}/v1/nope").status_code == 401  # nothing about routes without the token
    assert httpx.get(f"{server.url}/v1/health").json()["status"] == "ok"  # health never needs it
    status, lines = server.post_lines("/v1/generate", body)
    assert status == 200 and result_of(lines)["status"] == 0


def test_the_root_confines_every_path(guarded) -> None:
    server, root, base = guarded
    outside = base / "outside.json"
    (root / "inside").mkdir()
    (root / "escape").symlink_to(base)
    (root / "out.json").symlink_to(outside)
    with server.client() as client:
        for body in (
            {"model": TOY, "pairs": "ster:pairs", "output": str(outside)},
            {"model": TOY, "pairs": "ster:pairs", "output": "../outside.json"},
            {"model": TOY, "pairs": "ster:pairs", "output": "inside/../../outside.json"},
            {"model": TOY, "pairs": "ster:pairs", "output": "escape/outside.json"},
            {"model": TOY, "pairs": "ster:pairs", "output": "out.json"},
            {"model": TOY, "pairs": str(base / "pairs.json"), "output": "ok.json"},
            {"model": str(base), "pairs": "ster:pairs", "output": "ok.json"},
            {"model": "someone/some-model", "pairs": "ster:pairs", "output": "ok.json"},
        ):
            response = client.post("/v1/train", json=body)
            assert response.status_code == 400, body
            error = response.json()["error"]
            assert "the server's root" in error and "\n" not in error, error
        assert not outside.exists() and not (root / "ok.json").exists()
        # relative paths are taken from the root; bundled names stay readable
        response = client.post("/v1/train", json={"model": TOY, "pairs": "ster:pairs", "output": "inside/calm.json"})
        assert json.loads(response.text.splitlines()[-1])["status"] == 0
    assert (root / "inside" / "calm.json").exists()


def test_ctrl_c_stops_the_server_and_cancels_its_jobs(tmp_path: Path) -> None:
    import signal

    running = start_server(tmp_path)
    out = tmp_path / "long.safetensors"
    with running.client() as client:
        with client.stream("POST", "/v1/tune/sft", json={**LONG_SFT, "output": str(out)}) as response:
            lines = response.iter_lines()
            next(lines)
            deadline = time.monotonic() + 30
            while httpx.get(f"{running.url}/v1/health").json()["running"] != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            running.process.send_signal(signal.SIGINT)
            rest = [json.loads(line) for line in lines]
    assert running.process.wait(timeout=60) == 130  # the convention for Ctrl-C, as for every command
    assert rest[-1]["status"] == 1 and "cancelled" in rest[-1]["json"]["error"]
    assert not out.exists()
    assert "Traceback" not in running.stderr_text()


def test_bad_server_flags_are_refused_in_one_sentence(tmp_path: Path) -> None:
    cases = (
        (["--port", "x"], 'error: --port must be a whole number from 0 to 65535; got "x"'),
        (["--port", "70000"], 'error: --port must be a whole number from 0 to 65535; got "70000"'),
        (["--token-file", str(tmp_path / "none")], f"error: cannot read the token file {tmp_path / 'none'}"),
        (["--root", str(tmp_path / "none")], f"error: --root {tmp_path / 'none'} is not a directory"),
    )
    for args, sentence in cases:
        with pytest.raises(AssertionError, match="exit 1") as failed:
            start_server(tmp_path, *args)
        assert sentence in str(failed.value) and "Traceback" not in str(failed.value)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AssertionError, match="the token file .* is empty"):
        start_server(tmp_path, "--token-file", str(tmp_path / "empty"))
