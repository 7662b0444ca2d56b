"""The Train pane on the real engine and the toy: where artifacts go, asking before replacing one,
results that say which job made them, and a progress line that only moves forward."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, ProgressBar, Select, Static

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.tui.app import SterApp
from ster.tui.progress import Track, first_step
from ster.tui.screens.dialogs import Confirm
from ster.tui.settings import Settings
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.train import TrainPane
from tests.tui.tui_helpers import settle

PAIRS = EXAMPLES_DIR / "pairs.json"
Scenario = Callable[[SterApp, Pilot, TrainPane], Awaitable[None]]


def drive(scenario: Scenario, settings: Settings | None = None) -> None:
    async def run() -> None:
        app = SterApp(settings or Settings(pairs=PAIRS, trait="calm"))
        async with app.run_test(size=(120, 34)) as pilot:
            await pilot.press("2")
            await pilot.pause()
            await scenario(app, pilot, app.query_one(TrainPane))

    asyncio.run(run())


def title(pane: TrainPane) -> str:
    return str(pane.query_one("#results-title", Static).render())


def message(pane: TrainPane) -> str:
    widget = pane.query_one("#message", Static)
    return str(widget.render()) if widget.display else ""


def rows(pane: TrainPane) -> list[list[str]]:
    table = pane.query_one(DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def artifacts() -> Path:
    import os

    return Path(os.environ["XDG_DATA_HOME"]) / "ster" / "artifacts"


def test_the_default_artifact_goes_to_the_data_directory_named_after_trait_method_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        expected = artifacts() / "calm.caa.ster-toy.ster.json"
        assert str(expected) in pane.query_one("#output", Input).placeholder
        await pilot.press("t")
        await settle(pilot, app)
        assert json.loads(expected.read_text())["method"] == "caa"
        assert app.settings.vector == expected
        await pilot.press("o")
        await settle(pilot, app)
        assert (artifacts() / "calm.optimized.ster-toy.ster.json").is_file()
        assert list(tmp_path.iterdir()) == []  # nothing lands in the directory the app was started from

    drive(scenario)


def test_an_existing_artifact_is_replaced_only_after_the_person_says_so(tmp_path: Path) -> None:
    output = tmp_path / "calm.json"
    older = '{"product": "ster", "trait_name": "calm", "vectors": [], "model": "a real model"}\n'
    output.write_text(older)

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        pane.query_one("#output", Input).value = str(output)
        await pilot.press("escape", "t")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        await pilot.press("n")
        await settle(pilot, app)
        assert output.read_text() == older
        assert [h.name for h in app.runner.handles if h.name == "train"] == []
        assert message(pane).startswith(f"kept {output}; nothing ran")
        await pilot.press("o")
        await pilot.pause()
        await pilot.press("y")
        await settle(pilot, app)
        assert json.loads(output.read_text())["product"] == "ster"

    drive(scenario)


def test_a_file_of_another_kind_is_never_offered_for_replacement(tmp_path: Path) -> None:
    output = tmp_path / "pairs.json"
    output.write_text('{"trait_name": "calm", "pairs": []}\n')

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        pane.query_one("#output", Input).value = str(output)
        await pilot.press("escape", "t")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)
        assert message(pane) == f"{output} holds a pair set, which the new artifact never replaces: name another file"
        assert [h.name for h in app.runner.handles if h.name == "train"] == []

    drive(scenario)


def test_results_show_what_the_last_job_did_and_older_ones_are_marked(tmp_path: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        pane.query_one("#output", Input).value = str(tmp_path / "a.json")
        await pilot.press("escape", "o")
        await settle(pilot, app)
        assert len(rows(pane)) == 12 and title(pane).startswith("optimize: 12 candidates")
        pane.query_one("#method", Select).value = "pca"
        pane.query_one("#layers", Input).value = "2"
        pane.query_one("#output", Input).value = str(tmp_path / "b.json")
        await pilot.press("escape", "t")
        await settle(pilot, app)
        assert title(pane) == "train: pca at layer 2, fitted on the whole set"
        assert [row[:2] for row in rows(pane)] == [["2", "pca"]]
        pane.query_one("#layers", Input).value = "9"
        pane.query_one("#output", Input).value = str(tmp_path / "c.json")
        await pilot.press("escape", "t")
        await settle(pilot, app)
        assert title(pane) == (
            "older result (the last train was refused): train: pca at layer 2, fitted on the whole set"
        )
        assert message(pane) == "layer 9 is out of range: this model has 4 layers, numbered 0..3"
        app._model_chosen({"model": "ster:toy-chat", "precision": "f32", "device": "cpu", "chat_template": "auto"})
        await pilot.pause()
        assert "the model has changed since" in title(pane)

    drive(scenario)


def test_the_idle_train_tab_has_nothing_that_moves() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        assert not pane.query(ProgressBar)  # Textual's bar animates while it has no total
        assert pane.query_one(JobProgress).plain.startswith("t trains, o optimizes")

    drive(scenario)


def test_optimize_progress_only_moves_forward_and_names_its_stage(tmp_path: Path) -> None:
    request = build_job_request("optimize", model="ster:toy", pairs=PAIRS, output=tmp_path / "o.json")
    track, steps = Track("optimize"), []
    final = run_job("optimize", request, lambda event: steps.append(track.advance(event)))
    assert final.type == "result"
    shown = [step for step in steps if step is not None]
    fractions = [step.fraction for step in shown]
    assert fractions == sorted(fractions) and fractions[-1] < 1.0  # 100% only once the job has ended
    assert {step.stage for step in shown} >= {"resolving", "reading", "fitting"}
    counted = [e for e in (step.message for step in shown) if e.startswith("fitting and ranking")]
    assert len(counted) == 4  # the per-layer fit counts 1..4 after the reads counted 1..12, and never goes back


def test_before_its_first_event_a_job_says_it_is_importing_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert "importing torch" in first_step("optimize").message
    assert first_step("pairs inspect").message == "starting"  # a job without a model imports no torch


def test_without_a_pair_set_train_says_where_to_get_one_in_the_apps_words() -> None:
    from ster.tui.words import NO_PAIRS

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        await pilot.press("t")
        await settle(pilot, app)
        assert message(pane) == NO_PAIRS and "--pairs" not in message(pane)

    drive(scenario, Settings())


def test_the_per_layer_plot_holds_each_layers_best_candidate_of_a_real_optimize_run() -> None:
    """The plot is textual-plotext's (as the Tune tab's curves): accuracy on the left axis, the holdout
    separation on the right, a green line at the selected layer; the values are the result document's."""
    from ster.tui.widgets.layer_plot import LayerPlot

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        plot = pane.query_one(LayerPlot)
        assert plot.plot_widget is None  # nothing drawn, nothing imported, before a result
        await pilot.press("o")
        await settle(pilot, app)
        result = [handle for handle in app.runner.handles if handle.name == "optimize"][-1].result
        assert result is not None
        candidates = result["selection"]["candidates"]
        best: dict[int, dict] = {}
        for row in candidates:  # per layer: the highest holdout accuracy, then the highest separation
            key = (row["holdout_accuracy"], row["holdout_separation"] or float("-inf"))
            if row["layer"] not in best or key > (
                best[row["layer"]]["holdout_accuracy"],
                best[row["layer"]]["holdout_separation"] or float("-inf"),
            ):
                best[row["layer"]] = row
        layers = sorted(best)
        selected = next(row for row in candidates if row["selected"])
        monitor = plot.plot_widget.plt._active.monitor  # what plotext was given to draw
        assert monitor.x == [layers, layers] and monitor.yside == ["left", "right"]
        assert monitor.y == [
            [best[layer]["holdout_accuracy"] for layer in layers],
            [best[layer]["holdout_separation"] for layer in layers],
        ]
        assert [x for line in monitor.vcoord for x in line] == [selected["layer"]] == [2]  # the selected layer's line
        assert (monitor.xlabel, monitor.ylabel) == (["layer", None], ["accuracy", "separation"])
        assert plot.plot_widget.region.height >= 10 and plot.plot_widget.region.width >= 30
        heading = str(plot.query_one("#layer-plot-title").render())
        assert heading == "best candidate per layer: accuracy left, separation right, ✓ layer 2"
        await pilot.press("s")  # the table's order is the table's; the plot stays as it was
        assert plot.plot_widget.plt._active.monitor.y[1] == [best[layer]["holdout_separation"] for layer in layers]

    drive(scenario)


def test_a_one_layer_train_plots_a_point_with_its_accuracy_and_margin() -> None:
    from ster.tui.widgets.layer_plot import LayerPlot

    async def scenario(app: SterApp, pilot: Pilot, pane: TrainPane) -> None:
        pane.query_one("#layers", Input).value = "2"
        await pilot.press("escape", "t")
        await settle(pilot, app)
        result = [handle for handle in app.runner.handles if handle.name == "train"][-1].result
        entry = result["layers"][0]
        monitor = pane.query_one(LayerPlot).plot_widget.plt._active.monitor
        assert monitor.x == [[2], [2]] and monitor.y == [[entry["train_accuracy"]], [entry["train_margin"]]]
        assert [x for line in monitor.vcoord for x in line] == [] and monitor.ylabel == [
            "accuracy",
            "margin",
        ]  # nothing selected

    drive(scenario)
