"""An artifact calibrated with ``calibrate --mode ablate``, loaded in the Train tab: its ablation's front, and
the Generate tab ablating as it was calibrated.

The artifact is the toy's, calibrated for real (a few seconds); the inspect job's summary is delivered through
the message a worker posts, and the Generate tab's requests are recorded rather than run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from ster.engine.protocol.events import Result
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.tui.messages import JobFinished
from ster.tui.runner import JobHandle
from ster.tui.settings import Settings
from tests.steering.test_ablation_calibrate import FLEE, REST
from tests.tui.test_tui_calibrate import RecordingApp, cells, drive, front, message, steered
from tests.tui.tui_helpers import until


@pytest.fixture(scope="module")
def ablated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    where = tmp_path_factory.mktemp("ablated")
    pairs = {"trait_name": "fleeing", "pairs": [{"positive": f, "negative": r} for f, r in zip(FLEE, REST)]}
    (where / "pairs.json").write_text(json.dumps(pairs))
    (where / "markers.json").write_text(json.dumps(["flee"]))
    fields = {
        "model": "ster:toy",
        "pairs": where / "pairs.json",
        "mode": "ablate",
        "refusal_markers": where / "markers.json",
        "trials": "8",
        "judge": "none",
        "output": where / "ablated.json",
    }
    final = run_job("calibrate", build_job_request("calibrate", **fields), lambda e: None, threading.Event())
    assert final.type == "result", final
    request = build_job_request("inspect", artifact=where / "ablated.json")
    summary = run_job("inspect", request, lambda e: None, threading.Event())
    assert summary.type == "result", summary
    return where / "ablated.json", summary.data


@pytest.fixture(autouse=True)
def data_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))


async def load(app: RecordingApp, pilot: Pilot, path: Path, summary: dict[str, Any]) -> None:
    await pilot.press("2")
    await pilot.pause()
    pane = app.query_one("#train-pane")
    handle = JobHandle(1, "inspect", build_job_request("inspect", artifact=path), pane)
    pane.post_message(JobFinished(handle, Result(command="inspect", data=summary)))
    await until(pilot, lambda: front(app).row_count > 0)


@pytest.mark.parametrize("size", [(80, 24), (120, 34)])
def test_a_loaded_ablation_shows_its_front_and_its_choice(ablated, size: tuple[int, int]) -> None:
    path, summary = ablated
    record = summary["calibration"]["ablation"]

    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await load(app, pilot, path, summary)
        rows = [cells(front(app), i) for i in range(front(app).row_count)]
        chosen = [row for row in rows if row[-1] == "✓ chosen"]
        assert len(chosen) == 1 and chosen[0][0] == str(record["direction_layer"])
        assert chosen[0][1] == f"{record['profile']['peak_weight']:.2f}"
        assert chosen[0][5] == f"{record['trait_rate']:.0%}" and chosen[0][6] == f"{record['kl_first']:.3f}"
        kls = [float(row[6]) for row in rows]
        assert kls == sorted(kls) and len(rows) >= 2  # the front's points and the chosen one, by KL
        assert cells(front(app), front(app).cursor_row) == chosen[0]
        title = str(app.query_one("#results-title").render())
        assert f"an ablation of the direction at layer {record['direction_layer']}" in title
        assert f"over {len(record['trials'])} trials" in title

    drive(scenario, Settings(trait="fleeing"), size=size)


def test_enter_on_the_chosen_ablation_makes_generate_ablate_as_calibrated(ablated) -> None:
    path, summary = ablated
    profile = summary["calibration"]["ablation"]["profile"]

    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await load(app, pilot, path, summary)
        await pilot.press("enter")  # the cursor starts on the chosen row
        await pilot.pause()
        assert "adopted: Generate ablates as ablated.json was calibrated" in message(app, "train")
        await pilot.press("3")
        await until(pilot, lambda: bool(app.query("#generate-pane")))
        await pilot.pause()
        assert app.query_one("#generate-pane").mode == "ablate"
        await pilot.press("g")
        await pilot.pause()
        fields = steered(app)
        request = build_job_request("generate", **fields)
        assert request.mode == "ablate" and request.vector == path
        assert request.direction_layer == summary["calibration"]["ablation"]["direction_layer"]
        assert request.profile.model_dump() == profile

    drive(scenario, Settings(trait="fleeing"))


def test_enter_on_another_point_says_its_flags(ablated) -> None:
    path, summary = ablated

    async def scenario(app: RecordingApp, pilot: Pilot) -> None:
        await load(app, pilot, path, summary)
        rows = [cells(front(app), i) for i in range(front(app).row_count)]
        other = next(i for i, row in enumerate(rows) if row[-1] != "✓ chosen")
        front(app).move_cursor(row=other)
        await pilot.press("enter")
        await pilot.pause()
        said = message(app, "train")
        assert "only the chosen ablation is the artifact's" in said
        assert f"--mode ablate --direction-layer {rows[other][0]} --peak-weight" in said

    drive(scenario, Settings(trait="fleeing"))
