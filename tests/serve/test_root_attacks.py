"""``ster serve --root`` attacked as a hostile client would: every path of every endpoint stays inside the root.

A real server on 127.0.0.1 serves a root directory; beside the root lie a checkpoint, a reward model
and files the client must never reach. Each test tries one way out: a folder named like a bundled
name, links at any component (made before the request, while it waits in the queue, or while it
runs), files of a model directory that link out, an output's sidecar or checkpoint that links out,
the sentences a refusal gives, and outputs aimed at what the root holds. Nothing outside the root may
be read, written or revealed, and nothing inside it may be destroyed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ster.engine.model.resolve import TOY_DIR
from ster.engine.protocol.jobs import request_class
from ster.engine.protocol.paths import is_path_field
from ster.serve import wire
from tests.serve.conftest import RIVER, TOY, Server, start_server, stop_server

OUTSIDE = "leads outside the server's root"


@pytest.fixture(scope="module")
def rooted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, Path]]:
    """A loopback server confined to base/root; base/outside holds a checkpoint and a file to protect."""
    base = tmp_path_factory.mktemp("rooted")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    shutil.copytree(TOY_DIR, outside / "model")
    (outside / "secret.json").write_text('{"trait_name": "secret", "pairs": [{"positive": "a", "negative": "b"}]}')
    home = tmp_path_factory.mktemp("rooted-xdg")
    env = {"XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state")}
    server = start_server(base, "--root", str(root), env=env)
    yield server, root, outside
    stop_server(server)
    assert "Traceback" not in server.stderr_text()


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def guarded_outside(rooted) -> Iterator[tuple[Server, Path, Path]]:
    """The rooted server, with a check after the test that nothing outside the root changed."""
    server, root, outside = rooted
    before = _snapshot(outside)
    yield server, root, outside
    assert _snapshot(outside) == before, "something outside the root was written"


def refused_before(server: Server, operation: str, body: dict) -> str:
    status, lines = server.post_lines(f"/v1/{operation}", body)
    assert status == 400, (operation, body, lines)
    return lines[0]["error"]


def result(server: Server, operation: str, body: dict) -> dict:
    status, lines = server.post_lines(f"/v1/{operation}", body)
    assert status == 200, (operation, body, lines)
    return lines[-1]


# --- bundled names are a fixed list ---------------------------------------------------------------


def test_a_folder_named_like_a_bundled_name_is_a_path_like_any_other(guarded_outside) -> None:
    server, root, outside = guarded_outside
    added = result(server, "pairs/add", {"pairs": "./ster:x/p.json", "positive": "calm", "negative": "alarmed"})
    assert added["status"] == 0 and (root / "ster:x" / "p.json").is_file()
    sneaky = f"ster:x/../../{outside.name}/model"
    for operation, body in (
        ("generate", {"model": sneaky, "prompt": RIVER, "maxNewTokens": 2}),
        ("tune/merge", {"model": sneaky, "adapter": "a.safetensors", "output": "copied"}),
        ("train", {"model": TOY, "pairs": f"ster:x/../../{outside.name}/secret.json", "output": "x.json"}),
    ):
        assert OUTSIDE in refused_before(server, operation, body)
    (root / "ster:evil").symlink_to(outside / "model")
    error = refused_before(server, "generate", {"model": "ster:evil", "prompt": RIVER, "maxNewTokens": 2})
    assert OUTSIDE in error
    assert not (root / "copied").exists()


# --- links at any component, made before the request ----------------------------------------------


def test_a_model_named_by_a_link_out_or_holding_files_that_link_out_is_refused(guarded_outside) -> None:
    server, root, outside = guarded_outside
    (root / "linked-model").symlink_to(outside / "model")
    error = refused_before(server, "generate", {"model": "linked-model", "prompt": RIVER, "maxNewTokens": 2})
    assert OUTSIDE in error
    leaky = root / "leaky-model"
    shutil.copytree(TOY_DIR, leaky)
    (leaky / "config.json").unlink()
    (leaky / "config.json").symlink_to(outside / "model" / "config.json")
    last = result(server, "generate", {"model": "leaky-model", "prompt": RIVER, "maxNewTokens": 2})
    assert (
        last["status"] == 1 and OUTSIDE in last["json"]["error"] and "leaky-model/config.json" in last["json"]["error"]
    )


def test_the_grpo_reward_is_a_path_inside_the_root(guarded_outside) -> None:
    server, root, outside = guarded_outside
    (root / "sub").mkdir(exist_ok=True)
    shutil.copy(outside / "secret.json", outside / "reward.safetensors")
    try:
        for reward in (
            "../outside/reward.safetensors",
            str(outside / "reward.safetensors"),
            "sub/../../outside/reward.safetensors",
        ):
            error = refused_before(
                server,
                "tune/grpo",
                {"model": TOY, "prompts": "ster:grpo-prompts", "reward": reward, "output": "g.safetensors"},
            )
            assert error.startswith(f"--reward {reward} {OUTSIDE}"), error
    finally:
        (outside / "reward.safetensors").unlink()


def test_an_outputs_sidecar_or_checkpoint_that_links_out_is_never_written(guarded_outside) -> None:
    server, root, outside = guarded_outside
    (root / "side.json").symlink_to(outside / "side.json")
    last = result(server, "tune/sft", {"model": TOY, "examples": "ster:examples", "output": "side.safetensors"})
    assert last["status"] == 1 and OUTSIDE in last["json"]["error"]
    (root / "ck.safetensors.checkpoint").symlink_to(outside / "ck.checkpoint")
    last = result(
        server,
        "tune/sft",
        {"model": TOY, "examples": "ster:examples", "output": "ck.safetensors", "checkpointEvery": 1, "epochs": 2},
    )
    assert last["status"] == 1 and OUTSIDE in last["json"]["error"]
    assert not (outside / "side.json").exists() and not (outside / "ck.checkpoint").exists()
    assert not (root / "side.safetensors").exists() and not (root / "ck.safetensors").exists()


# --- links made after the check: while the job waits, while it runs --------------------------------


def _hold_the_model(server: Server, output: str) -> tuple[httpx.Client, Any, Iterator[str], str]:
    """A long training run that holds the model, read until its first step (its outputs are checked by then)."""
    client = server.client()
    stream = client.stream(
        "POST", "/v1/tune/sft", json={"model": TOY, "examples": "ster:examples", "epochs": 5000, "output": output}
    )
    response = stream.__enter__()
    lines = response.iter_lines()
    for line in lines:
        if " step " in json.loads(line).get("chunk", ""):
            break
    return client, stream, lines, response.headers["x-ster-job"]


def test_a_link_swapped_in_while_a_job_waits_in_the_queue_does_not_redirect_its_write(guarded_outside) -> None:
    server, root, outside = guarded_outside
    (root / "queued").mkdir()
    holder, held, _, job = _hold_the_model(server, "holder.safetensors")
    try:
        with (
            server.client() as client,
            client.stream(
                "POST",
                "/v1/train",
                json={"model": TOY, "pairs": "ster:pairs", "layers": "2", "output": "queued/calm.json"},
            ) as waiting,
        ):
            lines = waiting.iter_lines()
            assert "waiting for the model" in json.loads(next(lines))["chunk"]
            (root / "queued").rename(root / "queued-was")
            (root / "queued").symlink_to(outside)  # swapped after the server checked the path
            client.post(f"/v1/jobs/{job}/cancel")
            rest = [json.loads(line) for line in lines]
    finally:
        held.__exit__(None, None, None)
        holder.close()
    assert rest[-1]["status"] == 1 and OUTSIDE in rest[-1]["json"]["error"], rest[-2:]
    assert not (outside / "calm.json").exists()


def test_a_link_swapped_in_while_a_job_runs_does_not_redirect_its_write(guarded_outside) -> None:
    server, root, outside = guarded_outside
    (root / "running").mkdir()
    holder, held, lines, job = _hold_the_model(server, "running/long.safetensors")
    try:
        (root / "running").rename(root / "running-was")
        (root / "running").symlink_to(outside)  # swapped while the run trains
        with server.client() as client:
            client.post(f"/v1/jobs/{job}/cancel")  # the run writes its checkpoint as it stops
        rest = [json.loads(line) for line in lines]
    finally:
        held.__exit__(None, None, None)
        holder.close()
    assert rest[-1]["status"] == 1 and "cancelled" in rest[-1]["json"]["error"], rest[-2:]
    assert not list(outside.glob("long*"))
    assert (root / "running-was" / "long.safetensors.checkpoint").is_file()  # where the run was pinned


# --- sentences, and what the root holds -------------------------------------------------------------


def test_an_output_cannot_replace_a_models_weights_inside_the_root(guarded_outside) -> None:
    server, root, _ = guarded_outside
    model = root / "mine"
    shutil.copytree(TOY_DIR, model)
    before = _snapshot(model)
    for body in (
        {"model": "mine", "examples": "ster:examples", "output": "mine/model.safetensors"},
        {"model": TOY, "examples": "ster:examples", "output": "mine/model.safetensors"},
    ):
        status, lines = server.post_lines("/v1/tune/sft", body)
        assert status == 400 or lines[-1]["status"] == 1, lines[-2:]
    assert _snapshot(model) == before


# --- every path field of every endpoint ---------------------------------------------------------------


_FILLERS = {
    "model": TOY,
    "pairs": "ster:pairs",
    "output": "o.json",
    "prompt": RIVER,
    "input": "ster:prompts",
    "vector": "v.json",
    "prompts": "ster:prompts",
    "examples": "ster:examples",
    "artifact": "a.json",
    "adapter": "a.safetensors",
    "trait": "calm",
    "count": 1,
    "positive": "a",
    "negative": "b",
    "index": 0,
    "id": "x",
    "source": "ster:pairs",
    "gguf": "x.gguf",
    "control_vector": "c.gguf",
}


def _path_fields() -> list[tuple[str, str]]:
    cases = []
    for operation, job in wire.OPERATIONS.items():
        for name, info in request_class(job).model_fields.items():
            if name == "model" or is_path_field(info.annotation) or (job == "tune grpo" and name == "reward"):
                cases.append((operation, name))
    return cases


def _body(operation: str, field: str, value: str) -> dict:
    job = wire.OPERATIONS[operation]
    body = {wire.camel(name): _FILLERS[name] for name in request_class(job).model_fields if name in _FILLERS}
    if operation == "pairs/save":
        body = {"output": "o.json", "entries": [{"positive": "a", "negative": "b"}]}
    key = "output" if (operation, field) == ("pairs/save", "pairs") else wire.camel(field)
    return {**body, key: value}


@pytest.mark.parametrize(("operation", "field"), _path_fields())
def test_every_path_field_of_every_endpoint_is_confined(rooted, operation: str, field: str) -> None:
    server, _, outside = rooted
    error = refused_before(server, operation, _body(operation, field, str(outside / "secret.json")))
    assert OUTSIDE in error, (operation, field, error)


@pytest.mark.parametrize(("operation", "field"), _path_fields())
def test_no_refusal_tells_whether_a_path_outside_exists(rooted, operation: str, field: str) -> None:
    """The same sentence, but for the path itself, for a file outside that exists and one that does not,
    named directly, by a link in the root, and through ``..``."""
    server, root, outside = rooted
    if not (root / "to-secret").is_symlink():
        (root / "to-secret").symlink_to(outside / "secret.json")
        (root / "to-nothing").symlink_to(outside / "nothing.json")
    for present, absent in (
        (str(outside / "secret.json"), str(outside / "nothing.json")),
        ("to-secret", "to-nothing"),
        ("../outside/secret.json", "../outside/nothing.json"),
        ("/etc/passwd", "/etc/passwd-x"),
    ):
        sentences = [
            refused_before(server, operation, _body(operation, field, value)).replace(value, "PATH")
            for value in (present, absent)
        ]
        assert sentences[0] == sentences[1], (operation, field, sentences)


# --- what a confined job writes still works -------------------------------------------------------------------


def test_confined_jobs_write_and_read_back_inside_the_root(guarded_outside) -> None:
    """Training, merging, exporting and importing under a root, each output read back by the next job."""
    from tests.protocol.toy_gguf import write_toy_gguf

    server, root, _ = guarded_outside
    steps = [
        ("tune/sft", {"model": TOY, "examples": "ster:examples", "output": "w/facts.safetensors"}),
        ("tune/inspect", {"adapter": "w/facts.safetensors"}),
        ("tune/merge", {"model": TOY, "adapter": "w/facts.safetensors", "output": "w/merged"}),
        ("tune/export-peft", {"adapter": "w/facts.safetensors", "output": "w/peft"}),
        ("generate", {"model": "w/merged", "prompt": RIVER, "maxNewTokens": 3}),
        ("generate", {"model": TOY, "adapter": "w/peft", "prompt": RIVER, "maxNewTokens": 3}),
    ]
    texts = []
    for operation, body in steps:
        last = result(server, operation, body)
        assert last["status"] == 0, (operation, last)
        texts.append(last["json"].get("text"))
    assert texts[-1] == texts[-2]  # the merged checkpoint and the exported adapter steer alike
    write_toy_gguf(root / "toy.gguf")
    last = result(server, "model/import", {"gguf": "toy.gguf", "output": "w/imported"})
    assert last["status"] == 0, last
    assert result(server, "generate", {"model": "w/imported", "prompt": RIVER, "maxNewTokens": 3})["status"] == 0
    assert not [p for p in (root / "w").iterdir() if p.name.startswith(".")]  # no temporary left
