"""The app acts on the facts events carry, not on the engine's sentences: with every sentence of every event
reworded on its way to the app, a cancelled tune run still shows where it stopped and the checkpoint it kept (in
the Tune tab, the Jobs row and the Adapters tab's book), and the chat-template decision still reaches the
settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from ster.engine.protocol import jobs
from ster.tui.app import SterApp
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.tune import TunePane, checkpoint_of
from tests.tui.test_tui_jobs_tune import drive, message_cell, run_of, start_sft
from tests.tui.tui_helpers import settle, until


def reworded(event: Any) -> Any:
    """The event with its sentence replaced by one no front end could parse; its other fields as they were."""
    if getattr(event, "message", None):
        return event.model_copy(update={"message": "reworded: " + " ".join(reversed(event.message.split()))})
    return event


@pytest.fixture
def rewording(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event the in-process runner passes to the app, and the job's final event, reworded."""
    run_job = jobs.run_job

    def run(name: str, request: Any, emit: Callable[[Any], None], *args: Any, **kwargs: Any) -> Any:
        return reworded(run_job(name, request, lambda event: emit(reworded(event)), *args, **kwargs))

    monkeypatch.setattr(jobs, "run_job", run)


def test_a_cancelled_run_reads_where_it_stopped_from_the_error_not_its_sentence(
    tmp_path: Path, paced_training: None, rewording: None
) -> None:
    out = tmp_path / "cut" / "a.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await start_sft(pilot, pane, out, epochs="30", accumulation="1")
        curves = pane.query_one(Curves)
        await until(pilot, lambda: len(curves.points.get("loss", [])) >= 2, 120)
        await pilot.press("ctrl+x")
        await settle(pilot, app, 120)
        assert app.settings.chat_decision == "absent"  # the toy publishes no chat template
        handle = run_of(app)
        assert handle.state == "cancelled" and handle.last_message.startswith("reworded: ")
        stopped = len(curves.points["loss"])
        said = str(pane.query_one("#message", Static).render())
        assert said.startswith(f"cancelled after step {stopped} of 240; r resumes the run"), said
        await pilot.press("6")
        await pilot.pause()
        first, second = message_cell(app, handle)[0].splitlines()
        assert first == f"loss {handle.loss:.4f} · step {stopped}/240"
        assert second.startswith("kept ") and checkpoint_of(out).is_file()
        kept = app.adapters.get(checkpoint_of(out))  # the Adapters tab lists the checkpoint, and where it stopped
        assert kept is not None and kept.summary == f"checkpoint, step {stopped}/240"

    drive(scenario)
