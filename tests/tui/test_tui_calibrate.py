"""The Train pane's calibration view and what adopting a point does to the Generate tab.

The calibrate job's result is canned (the toy's, ``canned_calibrate.json``) and delivered through the same
messages a worker posts, so these run in seconds; the Generate tab's requests are recorded rather than run
(the canned artifact is not on disk), and checked by building them as the app's runner would. Fitting another
candidate of the front runs the real ``train`` job on the toy.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.jobs import build_job_request
from ster.tui.app import SterApp
from ster.tui.settings import Settings
from ster.tui.widgets.calibration_view import CalibrationView
from tests.tui.test_snapshots import CALIBRATED, canned_calibrate
from tests.tui.tui_helpers import settle, until

REPO = Path(__file__).parents[2]
PAIRS = EXAMPLES_DIR / "pairs.json"
CALIBRATED_PATH = Path("/data/ster/artifacts/calm.calibrated.ster-toy.ster.json")


class RecordingApp(SterApp):
    """The app, recording the fields of every generate and calibrate request instead of running it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.generated: list[dict[str, Any]] = []
        self.calibrations: list[dict[str, Any]] = []

    def start_job(self, job: str, fields: dict[str, Any], owner: Any) -> Any:
        if job in ("generate", "calibrate"):
            (self.generated if job == "generate" else self.calibrations).append(fields)
            return None
        return super().start_job(job, fields, owner)


Scenario = Callable[[RecordingApp, Pilot], Awaitable[None]]


def drive(scenario: Scenario, settings: Settings | None = None, size: tuple[int, int] = (120, 34)) -> None:
    async def run() -> None:
        app = RecordingApp(settings or Settings(trait="calm", pairs=PAIRS))
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await scenario(app, pilot)

    asyncio.run(run())


@pytest.fixture(autouse=True)
def data_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))


def front(app: SterApp) -> DataTable:
    return app.query_one(CalibrationView).query_one(DataTable)


def cells(table: DataTable, row: int) -> list[str]:
    return [str(cell) for cell in table.get_row_at(row)]


def steered(app: RecordingApp) -> dict[str, Any]:
    """The last steered generate request's fields (the one with an artifact)."""
    return [fields for fields in app.generated if "vector" in fields][-1]


def message(app: SterApp, pane: str) -> str:
    return str(app.query_one(f"#{pane}-pane").query_one("#message", Static).render())


def test_the_front_lists_each_sign_by_kl_with_the_chosen_points_marked() -> None:
    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await pilot.press("2")
        canned_calibrate(app)
        await until(pilot, lambda: front(app).row_count > 0)
        rows = [cells(front(app), i) for i in range(front(app).row_count)]
        assert rows[0][0] == "+" and rows[-1][0] == "−"
        chosen = [row for row in rows if row[-1] == "✓ chosen"]
        assert [row[:4] for row in chosen] == [["+", "2", "logistic", "+0.422x"], ["−", "2", "logistic", "-0.483x"]]
        assert chosen[1][5] == "+0.205"  # behaviour moved toward the negative side: its own way, so positive
        plus = [float(row[4]) for row in rows if row[0] == "+"]
        assert plus == sorted(plus)
        assert cells(front(app), front(app).cursor_row) == chosen[0]  # the cursor starts on the + chosen point
        await pilot.pause()
        assert app.focused is front(app), app.focused

    drive(scenario)


def test_enter_on_a_row_adopts_it_and_generate_then_sends_its_strength() -> None:
    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await pilot.press("2")
        canned_calibrate(app)
        await until(pilot, lambda: front(app).row_count > 0)
        await pilot.press("down", "enter")  # +0.9x, the calibrated candidate's own ladder point
        await pilot.pause()
        assert app.settings.vector == CALIBRATED_PATH and app.settings.strength == "0.9x"
        await pilot.press("up", "enter")  # the chosen point
        await pilot.pause()
        assert app.settings.strength == "0.4223x"
        assert "adopted: Generate steers at +0.422x, the calibrated strength" in message(app, "train")
        await pilot.press("3")
        await until(pilot, lambda: bool(app.query("#generate-pane")))
        await pilot.pause()
        assert app.query_one("#generate-pane").query_one("#strength").value == "0.4223x"
        await pilot.press("g")
        await pilot.pause()
        fields = steered(app)
        assert fields["strength"] == "0.4223x"
        request = build_job_request("generate", **fields)
        assert request.vector == CALIBRATED_PATH and str(request.strength) == "0.4223x"

    drive(scenario)


def test_a_calibrated_artifact_with_no_typed_strength_sends_none_and_says_which_it_steers_at() -> None:
    summary = {key: value for key, value in CALIBRATED.items() if key != "front"}
    plain = {**summary, "calibration": None}

    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await pilot.press("3")
        await until(pilot, lambda: bool(app.query("#generate-pane")))
        await pilot.pause()
        field = app.query_one("#generate-pane").query_one("#strength")
        assert field.value == "" and field.placeholder == "calibrated +0.422x"
        await pilot.press("g")
        await pilot.pause()
        assert "strength" not in steered(app)
        assert build_job_request("generate", **steered(app)).strength is None  # the engine's calibrated strength
        sweep = app.query_one("#generate-pane").query_one("#strengths")
        record = CALIBRATED["calibration"]
        sides = [round(record[sign]["strength"], 4) for sign in ("positive", "negative")]
        walked = sorted({round(step * side, 4) for side in sides for step in (0.5, 1, 2)})  # what the engine walks
        assert sweep.value == ",".join(f"{v:g}x" for v in walked)
        app.settings.use_artifact(Path("plain.json"), plain)  # an uncalibrated artifact: the default, sent
        app.settings_changed("artifact")
        await pilot.pause()
        assert field.value == "0.4x"
        assert sweep.value == "-0.8x,-0.4x,-0.2x,0.2x,0.4x,0.8x"
        await pilot.press("g")
        await pilot.pause()
        assert steered(app)["strength"] == "0.4x"
        field.value = "0.2x"  # typed: kept when a calibrated artifact comes
        app.settings.use_artifact(CALIBRATED_PATH, summary)
        app.settings_changed("artifact")
        await pilot.pause()
        assert field.value == "0.2x"

    settings = Settings(trait="calm", pairs=PAIRS)
    settings.use_artifact(CALIBRATED_PATH, summary)
    drive(scenario, settings)


def test_enter_on_another_candidate_fits_it_with_train_and_adopts_it_at_that_strength(tmp_path: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await pilot.press("2")
        canned_calibrate(app)
        await until(pilot, lambda: front(app).row_count > 0)
        table = front(app)
        at = next(i for i in range(table.row_count) if cells(table, i)[:4] == ["+", "1", "pca", "+0.9x"])
        table.move_cursor(row=at)
        await pilot.press("enter")
        await settle(pilot, app)
        train = [h for h in app.runner.handles if h.name == "train"][-1]
        assert train.state == "done"
        assert train.request.method == "pca" and train.request.layers == "1"
        written = tmp_path / "ster" / "artifacts" / "calm.pca-l1.ster-toy.ster.json"
        assert written.exists() and app.settings.vector == written
        assert app.settings.strength == "0.9x"
        assert "adopted: Generate steers at +0.9x, pca at layer 1" in message(app, "train")
        assert front(app).row_count > 0 and app.query_one(CalibrationView).display  # the front stays

    drive(scenario)


def test_a_loaded_calibrated_artifact_shows_its_front_without_importing_torch() -> None:
    """The inspect job's summary carries the calibration's trials; the front is computed from them here, with the
    engine's pareto, which must not pull torch into the app (nor must the view)."""
    summary = {key: value for key, value in CALIBRATED.items() if key != "front"}
    code = f"""
import asyncio, json, sys
from pathlib import Path
from ster.engine.protocol.events import Result
from ster.tui.app import SterApp
from ster.tui.messages import JobFinished
from ster.tui.runner import JobHandle
from ster.tui.settings import Settings
from ster.engine.protocol.jobs import build_job_request
async def main():
    app = SterApp(Settings(trait="calm"))
    async with app.run_test(size=(120, 34)) as pilot:
        await pilot.pause()
        await pilot.press("2")
        await pilot.pause()
        pane = app.query_one("#train-pane")
        handle = JobHandle(1, "inspect", build_job_request("inspect", artifact=Path("cal.json")), pane)
        pane.post_message(JobFinished(handle, Result(command="inspect", data=json.loads({json.dumps(json.dumps(summary))}))))
        await pilot.pause(0.3)
        table = app.query_one("#front")
        print("ROWS", table.row_count)
        print("CHOSEN", sum("chosen" in str(table.get_row_at(i)[-1]) for i in range(table.row_count)))
        print("TORCH" if "torch" in sys.modules else "NO TORCH")
asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "NO TORCH" in proc.stdout, proc.stdout + proc.stderr
    assert f"ROWS {len(CALIBRATED['front']) + 2}" in proc.stdout and "CHOSEN 2" in proc.stdout, proc.stderr


def test_c_calibrates_the_apps_model_and_pairs_into_the_default_artifact_and_resumes_a_left_study(
    tmp_path: Path,
) -> None:
    output = tmp_path / "ster" / "artifacts" / "calm.calibrated.ster-toy.ster.json"

    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await pilot.press("2")
        await pilot.pause()
        app.query_one("#train-pane").query_one("#layers").value = "1..3"
        await pilot.press("escape", "c")
        await pilot.pause()
        fields = app.calibrations[-1]
        assert fields["output"] == output and fields["pairs"] == PAIRS and fields["layers"] == "1..3"
        assert fields["model"] == "ster:toy" and fields["resume"] is False
        build_job_request("calibrate", **fields)  # a request the engine takes
        output.parent.mkdir(parents=True)
        output.with_name("calm.calibrated.ster-toy.ster.study.json").write_text("{}")  # an interrupted run's trials
        await pilot.press("c")
        await pilot.pause()
        assert app.calibrations[-1]["resume"] is True
        assert "resuming the study" in message(app, "train")

    drive(scenario)
