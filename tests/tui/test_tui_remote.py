"""``ster tui --server URL``: the app runs every job on a real ``ster serve`` and shows it as it would a local one.

The server is a subprocess on 127.0.0.1, in its own directory and workspace (see
:mod:`tests.serve.conftest`); the app talks to it through :class:`ster.serve.client.Remote`.
The server's ``GET /v1/health`` counts the jobs it finished and cancelled, which is how the
tests know a job ran there and not in the test's own process.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Input

from ster.engine.protocol.paths import EXAMPLES_DIR
from ster.serve.client import Remote, jsonable
from ster.tui.app import SterApp
from ster.tui.settings import Settings
from ster.tui.widgets.generate import GeneratePane
from ster.tui.widgets.jobs import JobsPane
from ster.tui.widgets.pairs import PairsPane
from ster.tui.widgets.status import StatusLine
from tests.serve.conftest import TOY, Server, served
from tests.tui.tui_helpers import screen_text, settle, until

UNSTEERED = "the town is flooding and we flee."
CALM = "the town is gentle and we rest."
"""What the toy says to the Generate pane's own prompt, unsteered and steered at 0.4x with the calm direction
``optimize`` selects (as in tests/tui/test_tui_generate.py)."""


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One loopback server for this module, in its own directory and workspace."""
    yield from served(tmp_path_factory, "tui-serve")


def health(server: Server) -> dict[str, Any]:
    with server.client() as client:
        answer = client.get("/v1/health")
    assert answer.status_code == 200
    return answer.json()


def idle(server: Server, seconds: float = 30.0) -> dict[str, Any]:
    """The server's health once no job runs or waits there (a cancelled job ends at its next step)."""
    deadline = time.monotonic() + seconds
    while True:
        state = health(server)
        if (state["running"], state["queued"]) == (0, 0) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def test_generate_runs_on_the_server_and_shows_its_text(remote_server: Server) -> None:
    before = idle(remote_server)["jobs"]

    async def scenario() -> None:
        app = SterApp(Settings(), remote=Remote(remote_server.url))
        async with app.run_test(size=(80, 40)) as pilot:
            assert app.sub_title.endswith(f"on {remote_server.url}")
            assert f"on {remote_server.url}" in screen_text(app)  # the title bar fits it in 80 columns
            assert f"f32 cpu on {remote_server.url.removeprefix('http://')}" in app.query_one(StatusLine).plain
            await pilot.pause()
            await app.action_show_tab("generate")
            pane = app.query_one(GeneratePane)
            await until(pilot, lambda: app.focused in pane.query("*"))
            app.query_one("#max-new-tokens", Input).value = "8"
            await pilot.press("escape", "g")
            await settle(pilot, app)
            [handle] = app.runner.handles
            assert (handle.name, handle.state) == ("generate", "done")
            assert handle.fields["model"] == TOY and "vector" not in handle.fields  # no artifact: the baseline
            assert pane.panel("baseline").text == UNSTEERED
            assert "model ster:toy" in app.query_one(StatusLine).plain
            # a bad field is still refused here, in the app's words, and nothing reaches the server
            refused = app.start_job("generate", {"model": TOY, "prompt": "question :", "seed": "x"}, pane)
            assert refused is None
            await pilot.pause()
            assert 'seed must be a whole number; got "x"' in str(pane.query_one("#message").render())

    asyncio.run(scenario())
    after = idle(remote_server)["jobs"]
    assert after["accepted"] == before["accepted"] + 1
    assert after["finished"] == before["finished"] + 1
    assert after["cancelled"] == before["cancelled"]


def test_open_optimize_and_steer_all_run_on_the_server(remote_server: Server, tmp_path: Path) -> None:
    """The Pairs tab opens a bundled set, the Train tab's optimize writes the artifact (on the server's
    disk, which here is this machine's), and the Generate tab steers with it: the toy's pinned texts."""
    before = idle(remote_server)["jobs"]
    artifact = tmp_path / "calm.json"

    async def scenario() -> list[str]:
        app = SterApp(Settings(pairs=EXAMPLES_DIR / "pairs.json"), remote=Remote(remote_server.url))
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot, app)  # the Pairs tab's open is a pairs inspect on the server
            assert app.query_one(PairsPane).pair_set.trait_name == "calm"
            await pilot.press("2")
            app.query_one("#output", Input).value = str(artifact)
            await pilot.press("escape", "o")
            await settle(pilot, app)
            assert app.settings.vector == artifact and app.settings.artifact is not None
            assert artifact.is_file()
            await app.action_show_tab("generate")
            pane = app.query_one(GeneratePane)
            await until(pilot, lambda: app.focused in pane.query("*"))
            app.query_one("#strength", Input).value = "0.4x"
            await pilot.press("escape", "g")
            await settle(pilot, app)
            assert (pane.panel("baseline").text, pane.panel("steered").text) == (UNSTEERED, CALM)
            # the bundled set travels by its reserved name, so the server reads its own copy
            assert jsonable(app.runner.handles[0].fields["pairs"]) == "ster:pairs"
            assert [h.state for h in app.runner.handles] == ["done"] * 4
            return [h.name for h in app.runner.handles]

    names = asyncio.run(scenario())
    assert names == ["pairs inspect", "optimize", "generate", "generate"]
    after = idle(remote_server)["jobs"]
    assert after["finished"] == before["finished"] + 4


def test_ctrl_x_cancels_a_long_job_on_the_server(remote_server: Server, tmp_path: Path) -> None:
    before = idle(remote_server)["jobs"]
    output = tmp_path / "adapter.safetensors"  # the server writes where the app names, on its own disk

    async def scenario() -> None:
        app = SterApp(Settings(), remote=Remote(remote_server.url))
        async with app.run_test(size=(100, 30)) as pilot:
            jobs = app.query_one(JobsPane)
            fields = {"model": TOY, "examples": "ster:examples", "epochs": 5000, "output": output}
            handle = app.start_job("tune sft", fields, jobs)
            assert handle is not None
            try:
                # under way on the server: its training steps stream back as progress
                await until(pilot, lambda: handle.step is not None and handle.step.message.startswith("epoch"))
                assert handle.state == "running" and health(remote_server)["running"] == 1
                await pilot.press("ctrl+x")
                await settle(pilot, app, seconds=30)
                assert handle.state == "cancelled"
                await pilot.press("6")
                table = app.query_one("#job-table", DataTable)
                row = table.get_row_index(str(handle.id))
                assert [str(cell) for cell in table.get_row_at(row)[1:3]] == ["tune sft", "cancelled"]
                assert "idle" in app.query_one(StatusLine).plain
            finally:  # a failed check must not leave the job training on the server for minutes
                app.runner.cancel()
                await settle(pilot, app, seconds=30)

    asyncio.run(scenario())
    after = idle(remote_server)
    assert after["status"] == "ok" and after["running"] == 0
    assert after["jobs"]["cancelled"] == before["cancelled"] + 1
    assert after["jobs"]["finished"] == before["finished"]


def test_an_unreachable_server_is_a_refusal_that_names_it() -> None:
    with socket.socket() as probe:  # a port nothing listens on: bind one, then let it go
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    async def scenario() -> None:
        app = SterApp(Settings(), remote=Remote(url, connect_timeout=2.0))
        async with app.run_test(size=(100, 30)) as pilot:
            handle = app.start_job(
                "generate", {"model": TOY, "prompt": "question :", "max_new_tokens": 2}, app.query_one(JobsPane)
            )
            assert handle is not None
            await settle(pilot, app, seconds=10)
            assert handle.state == "refused"
            assert handle.last_message.startswith(f"cannot reach the Ster server at {url}")

    asyncio.run(scenario())
