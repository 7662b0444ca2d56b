"""Tune runs in the Jobs tab, on the real engine and the toy at 80x24: the row leads with the run's last loss,
a cancelled run's row names the checkpoint it kept, and enter on a finished run opens its report whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import DataTable

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.tui.app import SterApp
from ster.tui.runner import JobHandle
from ster.tui.screens.help import HelpScreen
from ster.tui.screens.job_result import JobResultScreen
from ster.tui.settings import Settings
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.jobs import JobsPane
from ster.tui.widgets.tune import TunePane, checkpoint_of
from tests.tui.tui_helpers import screen_text, settle, until

Scenario = Callable[[SterApp, Pilot, TunePane], Awaitable[None]]


def drive(scenario: Scenario, size: tuple[int, int] = (80, 24)) -> None:
    async def run() -> None:
        app = SterApp(Settings(pairs=EXAMPLES_DIR / "pairs.json", trait="calm"))
        async with app.run_test(size=size) as pilot:
            await pilot.press("4")
            await pilot.pause()
            await scenario(app, pilot, app.query_one(TunePane))

    asyncio.run(run())


async def start_sft(pilot: Pilot, pane: TunePane, out: Path, epochs: str, accumulation: str) -> None:
    for name, value in {
        "data": "ster:examples",
        "epochs": epochs,
        "accumulation": accumulation,
        "learning-rate": "5e-3",
        "output": str(out),
    }.items():
        pane.query_one(f"#{name}").value = value
    pane.query_one(Curves).focus()  # the pane's keys, not a field's typing
    await pilot.pause()
    await pilot.press("t")


def run_of(app: SterApp) -> JobHandle:
    return next(handle for handle in reversed(app.runner.handles) if handle.name == "tune sft")


def message_cell(app: SterApp, handle: JobHandle) -> tuple[str, int]:
    """The row's last-message cell as plain text, and the column's width."""
    table = app.query_one("#job-table", DataTable)
    column = next(c for c in table.columns.values() if str(c.label) == "last message")
    return str(table.get_row(str(handle.id))[-1]), column.width


def test_an_sft_runs_row_shows_its_last_loss_while_it_runs_and_once_it_ends(tmp_path: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await start_sft(pilot, pane, tmp_path / "a.safetensors", epochs="3", accumulation="4")
        await pilot.press("6")  # the table is drawn to the width it has on screen
        await until(pilot, lambda: app.runner.handles and run_of(app).loss is not None, 120)
        handle = run_of(app)
        cell, width = message_cell(app, handle)
        assert cell.startswith("loss ") and len(cell) <= width and width >= 28, cell
        await settle(pilot, app, 120)
        assert handle.state == "done" and handle.result is not None
        final_loss = handle.result["report"]["final_loss"]
        assert handle.loss == final_loss
        cell, width = message_cell(app, handle)
        assert cell == f"loss {final_loss:.4f} · finished" and len(cell) <= width
        assert f"loss {final_loss:.4f} · finished" in screen_text(app)  # whole on screen at 80 columns

    drive(scenario)


def test_a_cancelled_runs_row_names_the_checkpoint_it_kept(tmp_path: Path, paced_training: None) -> None:
    out = tmp_path / "cut" / "a.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await start_sft(pilot, pane, out, epochs="30", accumulation="1")
        curves = pane.query_one(Curves)
        await until(pilot, lambda: len(curves.points.get("loss", [])) >= 2, 120)
        await pilot.press("ctrl+x")
        await settle(pilot, app, 120)
        await pilot.press("6")
        await pilot.pause()
        handle = run_of(app)
        assert handle.state == "cancelled" and handle.result is None and checkpoint_of(out).is_file()
        cell, width = message_cell(app, handle)
        first, second = cell.splitlines()
        stopped = len(curves.points["loss"])
        assert first == f"loss {handle.loss:.4f} · step {stopped}/240" and len(first) <= width
        assert second.startswith("kept ") and second.endswith("a.safetensors.checkpoint") and len(second) <= width
        assert str(checkpoint_of(out)).endswith(second.removeprefix("kept ").lstrip("…"))
        assert "a.safetensors.checkpoint" in screen_text(app)
        await pilot.press("enter")  # a cancelled run has no result: the pane says so, nothing opens
        await pilot.pause()
        assert not isinstance(app.screen, JobResultScreen)

    drive(scenario)


def test_enter_on_a_finished_run_opens_its_report_and_escape_closes_it(tmp_path: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await start_sft(pilot, pane, tmp_path / "a.safetensors", epochs="1", accumulation="4")
        await settle(pilot, app, 120)
        handle = run_of(app)
        assert handle.state == "done"
        await pilot.press("6")
        await pilot.pause()
        assert "Result" in screen_text(app)  # the key bar names enter's action
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, JobResultScreen)
        final_loss = handle.result["report"]["final_loss"]
        assert f'"final_loss": {json.dumps(final_loss)}' in screen.document
        assert json.loads(screen.document) == json.loads(json.dumps(handle.result, default=str))
        assert "final_loss" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, JobResultScreen) and app.query_one(JobsPane).handles

    drive(scenario)


def test_the_help_screen_lists_enter_on_the_jobs_tab() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        jobs = dict(app.screen.sections)["Jobs tab"]
        assert any(binding.key == "enter" and binding.action == "show_result" for binding in jobs)

    drive(scenario)
