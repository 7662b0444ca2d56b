"""The Generate pane on the real engine and the bundled toy checkpoint, driven through Pilot.

The toy is deterministic by construction, so its texts are pinned: unsteered, the town
floods; steered at strength 3 with the calm direction, it is gentle.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static

from ster.cli import main
from ster.tui.app import SterApp
from ster.tui.messages import JobFinished
from ster.tui.settings import Settings
from ster.tui.widgets.generate import NO_ARTIFACT, GeneratePane, SweepTable, TextPanel

REPO = Path(__file__).parents[2]
UNSTEERED = "the town is flooding and we flee."
CALM = "the town is gentle and we rest."


@pytest.fixture(scope="module")
def calm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calm direction for the toy, selected by ``ster optimize`` in-process."""
    output = tmp_path_factory.mktemp("artifact") / "calm.json"
    code = main(["optimize", "--model", "ster:toy", "--pairs", str(REPO / "ster/data/examples/pairs.json"),
                 "--output", str(output)])
    assert code == 0
    return output


class RecordingApp(SterApp):
    """The app, keeping every job's final event so a test can compare it with what the pane showed."""

    def __init__(self, settings: Settings, models: Any = None) -> None:
        super().__init__(settings, models)
        self.finals: list[Any] = []

    def on_job_finished(self, message: JobFinished) -> None:
        self.finals.append(message.final)
        super().on_job_finished(message)


class HeldStore:
    """The engine's model store, holding each job at its model load until released: the toy generates
    in milliseconds, so this is how a test cancels a generation that is under way."""

    def __init__(self) -> None:
        from ster.engine.model.loading import ModelStore

        self.store = ModelStore()
        self.release = threading.Event()

    def open(self, *args: Any, **kwargs: Any) -> Any:
        self.release.wait(10)
        return self.store.open(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def drive(settings: Settings, scenario: Callable[[RecordingApp, Pilot, GeneratePane], Awaitable[None]],
          models: Any = None) -> None:
    """Open the app on the Generate tab and run one scenario against it."""

    async def run() -> None:
        app = RecordingApp(settings, models)
        async with app.run_test(size=(140, 40)) as pilot:
            pane = app.query_one(GeneratePane)
            await pilot.pause()  # the app shows the Pairs tab once mounted; switch after that
            app.action_show_tab("generate")
            await until(pilot, lambda: app.focused in pane.query("*"))
            await scenario(app, pilot, pane)

    asyncio.run(run())


async def until(pilot: Pilot, condition: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("the condition never held")


async def settle(app: RecordingApp, pilot: Pilot) -> None:
    """Wait until every job has ended and its final message was handled."""
    for _ in range(400):
        await pilot.pause(0.05)
        if not app.runner.active():
            break
    await pilot.pause()
    assert not app.runner.active(), "a job did not finish in 20 s"


def generations(app: RecordingApp) -> list[Any]:
    """The generate jobs the app ran (the Pairs pane runs jobs of its own)."""
    return [handle for handle in app.runner.handles if handle.name == "generate"]


def message(pane: GeneratePane) -> str:
    return str(pane.query_one("#message", Static).content)


def test_generate_streams_unsteered_and_steered_side_by_side(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g")
        await settle(app, pilot)
        baseline, steered = pane.panel("baseline"), pane.panel("steered")
        assert (baseline.text, steered.text) == (UNSTEERED, CALM)
        assert [h.request.vector for h in generations(app)] == [None, calm]
        assert steered.border_title.startswith("steered at strength 3 (relative 0.29")
        assert baseline.border_title == "unsteered"
        assert app.settings.chat_decision == "absent"
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_streamed_tokens_are_the_result_text(calm: Path) -> None:
    """The panels hold only what the token events carried; the results must say the same."""

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g")
        await settle(app, pilot)
        by_vector = {final.data["vector"]: final.data["text"] for final in app.finals
                     if final.type == "result" and final.command == "generate"}
        assert pane.panel("baseline").text == by_vector[None] == UNSTEERED
        assert pane.panel("steered").text == by_vector[str(calm)]

    drive(Settings(vector=calm), scenario)


def test_strength_keys_step_the_field_and_reach_negative(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        field = pane.query_one("#strength", Input)
        await pilot.press("]", "]")
        assert field.value == "5"
        await pilot.press("{")
        assert field.value == "4.9"
        await pilot.press("}", *["["] * 8)
        assert field.value == "-3"
        field.focus()  # the step keys work while the field itself has focus, and type nothing
        await pilot.press("[")
        assert field.value == "-4"
        await pilot.press("escape", "g")
        await settle(app, pilot)
        assert pane.panel("steered").border_title.startswith("steered at strength -4 (relative -0.3")
        assert pane.panel("steered").text == UNSTEERED  # the toy has nothing beyond its own default
        await pilot.press("p", "ctrl+u", *"question : tell me about the lake . answer :", "enter")
        await settle(app, pilot)  # enter in the prompt generates
        assert pane.panel("baseline").text.startswith("the lake")

    drive(Settings(vector=calm), scenario)


def test_sweep_fills_the_table_and_marks_the_suggestion(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("w")
        await settle(app, pilot)
        table = pane.query_one(DataTable)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert list(rows) == ["-6", "-3", "+0", "+3", "+6"]
        assert rows["+0"][7] == "baseline" and rows["+0"][8] == UNSTEERED
        assert rows["+3"][8] == CALM and rows["+3"][6] == "yes"
        assert rows["+6"][7] == rows["-6"][7] == "◀ suggested"
        assert pane.query_one(SweepTable).texts["+3/0"] == CALM  # what the token events streamed into the output cell
        assert "suggested: positive +6, negative -6" in str(pane.query_one("#caption", Static).content)
        table.focus()
        table.move_cursor(row=3)
        await pilot.press("enter")
        assert pane.query_one("#strength", Input).value == "3"

    drive(Settings(vector=calm), scenario)


def test_an_artifact_for_another_model_is_refused_and_the_pane_stays_usable(calm: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(calm.read_text()), "model": "someone/other-model",
                                 "model_fingerprint": None}))

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g")
        await settle(app, pilot)
        line = pane.query_one("#message", Static).content
        assert line.plain == 'artifact was trained for model "someone/other-model", current model is "ster:toy"'
        assert str(line.get_style_at_offset(app.console, 0).color.name) == "red"
        assert pane.panel("steered").border_title.endswith("(refused)")
        assert pane.panel("baseline").text == UNSTEERED
        app.settings.vector = calm
        await pilot.press("g")
        await settle(app, pilot)
        assert pane.panel("steered").text == CALM and message(pane) == ""

    drive(Settings(vector=other), scenario)


def test_a_provenance_warning_shows_in_yellow_and_the_run_goes_on(calm: Path, tmp_path: Path) -> None:
    halved = tmp_path / "halved.json"
    halved.write_text(json.dumps({**json.loads(calm.read_text()), "precision": "bf16"}))

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g")
        await settle(app, pilot)
        line = pane.query_one("#message", Static).content
        assert line.plain.startswith("warning: this direction was trained at precision bf16")
        assert str(line.get_style_at_offset(app.console, 0).color.name) == "yellow"
        assert pane.panel("steered").text == CALM

    drive(Settings(vector=halved), scenario)


def test_a_bad_number_is_refused_in_one_sentence(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        pane.query_one("#max-new-tokens", Input).value = "0"
        await pilot.press("g")
        await settle(app, pilot)
        assert message(pane) == "--max-new-tokens must be at least 1"
        assert generations(app) == []

    drive(Settings(vector=calm), scenario)


def test_a_cancelled_generation_marks_its_panels(calm: Path) -> None:
    store = HeldStore()

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g", "ctrl+x")  # the baseline is held at its model load, the steered one queued
        store.release.set()
        await settle(app, pilot)
        assert [h.state for h in generations(app)] == ["cancelled", "cancelled"]
        assert pane.panel("baseline").border_title == "unsteered (cancelled)"
        assert pane.panel("steered").border_title == "steered at strength 3 (cancelled)"
        assert message(pane) == ""
        await pilot.press("g")
        await settle(app, pilot)
        assert pane.panel("steered").text == CALM

    drive(Settings(vector=calm), scenario, store)


def test_without_an_artifact_only_the_baseline_runs() -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.click("#generate-button")
        await settle(app, pilot)
        assert [h.request.vector for h in generations(app)] == [None]
        assert pane.panel("baseline").text == UNSTEERED
        assert pane.panel("steered").text == ""
        assert message(pane) == NO_ARTIFACT
        assert isinstance(pane.panel("steered"), TextPanel)

    drive(Settings(), scenario)
