"""The Generate pane on the real engine and the bundled toy checkpoint, driven through Pilot.

The toy is deterministic by construction, so its texts are pinned: unsteered, the town
floods; steered with the calm direction at the default strength (0.4x, about 4.1 in the
residual stream's units at the toy's layer 3), it is gentle.
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
from textual.widgets import Input, Static

from ster.cli import main
from ster.tui.app import SterApp
from ster.tui.messages import JobFinished
from ster.tui.settings import Settings
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP, Strength
from ster.tui.widgets.generate import NO_ARTIFACT, GeneratePane, SweepTable, TextPanel
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.status import StatusLine
from tests.tui.tui_helpers import screen_text

REPO = Path(__file__).parents[2]
PROMPT_TEXT = "question : tell me about the town . answer :"
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
    widget = pane.query_one("#message", Static)
    return str(widget.content) if widget.display else ""




STRENGTH = "0.4x"
"""The strength these tests generate at; set explicitly, since the default is tuned on a real model."""
SWEEP = "-0.8x,-0.4x,0.4x,0.8x"


async def form(pilot: Pilot, pane: GeneratePane, **values: str) -> None:
    """Type values into the form's fields (by id, underscores for dashes), then leave the field."""
    for name, value in values.items():
        pane.query_one(f"#{name.replace('_', '-')}", Input).value = value
    await pilot.pause()


def test_generate_runs_steered_first_then_unsteered_side_by_side(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        baseline, steered = pane.panel("baseline"), pane.panel("steered")
        assert (baseline.text, steered.text) == (UNSTEERED, CALM)
        assert [h.request.vector for h in generations(app)] == [calm, None]
        assert steered.border_title == "steered 0.4x · calm (caa, layer 3)"
        assert steered.border_subtitle.startswith("= 4.12 absolute · 8 tokens")
        assert baseline.border_title == "unsteered"
        assert "artifact calm (caa, layer 3)" in app.query_one(StatusLine).plain
        assert app.settings.chat_decision == "absent"
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_streamed_tokens_are_the_result_text(calm: Path) -> None:
    """The panels hold only what the token events carried; the results must say the same."""

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        by_vector = {final.data["vector"]: final.data["text"] for final in app.finals
                     if final.type == "result" and final.command == "generate"}
        assert pane.panel("baseline").text == by_vector[None] == UNSTEERED
        assert pane.panel("steered").text == by_vector[str(calm)]

    drive(Settings(vector=calm), scenario)


def test_relative_strength_is_the_default_and_the_keys_step_in_the_fields_unit(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        field = pane.query_one("#strength", Input)
        assert field.value == DEFAULT_STRENGTH and Strength.model_validate(field.value).relative
        assert pane.query_one("#strengths", Input).value == DEFAULT_SWEEP
        await form(pilot, pane, strength="0.4x")
        await pilot.press("]", "]")
        assert field.value == "0.6x"
        await pilot.press("{")
        assert field.value == "0.59x"
        await pilot.press("}", *["["] * 8)
        assert field.value == "-0.2x"
        field.focus()  # the step keys work while the field itself has focus, and type nothing
        await pilot.press("[")
        assert field.value == "-0.3x"
        await pilot.press("escape", "g")
        await settle(app, pilot)
        assert pane.panel("steered").border_title.startswith("steered -0.3x · calm")
        assert pane.panel("steered").text == UNSTEERED  # the toy has nothing beyond its own default
        await form(pilot, pane, strength="3")  # an absolute strength steps by 1 and 0.1
        await pilot.press("]", "}")
        assert field.value == "4.1"
        await pilot.press("p", "ctrl+u", *"question : tell me about the lake . answer :", "enter")
        await settle(app, pilot)  # enter in the prompt generates
        assert pane.panel("baseline").text.startswith("the lake")
        assert pane.panel("steered").border_title.startswith("steered 4.1 · calm")

    drive(Settings(vector=calm), scenario)


def test_sweep_fills_the_table_explains_effect_and_opens_a_row(calm: Path) -> None:
    from ster.tui.screens.sweep_row import SweepRowDialog

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strengths=SWEEP)
        await pilot.press("w")
        await settle(app, pilot)
        table = pane.query_one(SweepTable)
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert list(rows) == ["-0.8x", "-0.4x", "0", "+0.4x", "+0.8x"]
        assert rows["0"][6] == "baseline" and rows["0"][7] == UNSTEERED
        assert rows["+0.4x"][7] == CALM and rows["+0.4x"][6] == "fluent"
        assert rows["+0.4x"][1] == "4.12"  # the same push in the residual stream's units
        assert rows["+0.8x"][6] == rows["-0.8x"][6] == "fluent ◀"
        assert table.texts["+0.4x/0"] == CALM  # what the token events streamed into the output cell
        caption = str(pane.query_one("#caption", Static).content)
        assert "suggested: +0.8x, -0.8x" in caption
        assert "effect: how far the text moved along the direction" in caption
        assert "+ toward calm, − away" in caption and "residual-stream units" in caption
        table.focus()
        table.move_cursor(row=3)
        await pilot.press("enter")
        assert isinstance(app.screen, SweepRowDialog)
        assert CALM in screen_text(app) and "layer 3: 4.119" in screen_text(app)
        await pilot.press("u")
        assert pane.query_one("#strength", Input).value == "0.4x"
        assert message(pane) == "strength set to 0.4x; g generates at it"

    drive(Settings(vector=calm), scenario)


def test_an_artifact_for_another_model_is_refused_before_anything_is_generated(calm: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(calm.read_text()), "model": "someone/other-model",
                                 "model_fingerprint": None}))

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        line = pane.query_one("#message", Static).content
        assert "someone/other-model" in line.plain and "ster:toy" in line.plain
        assert str(line.get_style_at_offset(app.console, 0).color.name) == "red"
        assert [h.state for h in generations(app)] == ["refused"]  # the baseline never ran
        assert not [final for final in app.finals if final.type == "result" and final.command == "generate"]
        assert pane.panel("steered").border_title.startswith("(refused) steered 0.4x")
        assert pane.panel("baseline").border_title == "(not run) unsteered" and pane.panel("baseline").text == ""
        app.settings.use_artifact(calm, None)
        await pilot.press("g")
        await settle(app, pilot)
        assert pane.panel("steered").text == CALM and pane.panel("baseline").text == UNSTEERED
        assert message(pane) == ""

    drive(Settings(vector=other), scenario)


def test_a_provenance_warning_shows_in_yellow_and_the_run_goes_on(calm: Path, tmp_path: Path) -> None:
    halved = tmp_path / "halved.json"
    halved.write_text(json.dumps({**json.loads(calm.read_text()), "precision": "bf16"}))

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        line = pane.query_one("#message", Static).content
        assert line.plain.startswith("warning: this direction was trained at precision bf16")
        assert str(line.get_style_at_offset(app.console, 0).color.name) == "yellow"
        assert pane.panel("steered").text == CALM

    drive(Settings(vector=halved), scenario)


@pytest.mark.parametrize(("field", "typed", "sentence"), [
    ("max-new-tokens", "0", "max tokens must be at least 1"),
    ("strength", "abc", 'strength is a number such as 3, or a multiple of the layer\'s activation norm such as '
                        '0.4x; "abc" is neither'),
    ("temperature", "warm", 'temp (temperature) is a number, 0 to decode greedily; "warm" is not'),
    ("strengths", "0.4x,3", "sweep mixes units: write every strength as a number (3) or every one with an x (0.4x)"),
])
def test_a_bad_field_is_refused_in_the_forms_words_and_cleared_once_fixed(calm: Path, field: str, typed: str,
                                                                          sentence: str) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        good = pane.query_one(f"#{field}", Input).value
        await form(pilot, pane, **{field: typed})
        await pilot.press("w" if field == "strengths" else "g")
        await settle(app, pilot)
        assert message(pane) == sentence
        assert "--" not in message(pane) and "Input should" not in message(pane)
        assert [h for h in app.runner.handles if h.name in ("generate", "sweep")] == []
        await form(pilot, pane, **{field: good})
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_a_cancelled_generation_marks_its_panels(calm: Path) -> None:
    store = HeldStore()

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g", "ctrl+x")  # the steered run is held at its model load; the baseline waits for it
        store.release.set()
        await settle(app, pilot)
        assert [h.state for h in generations(app)] == ["cancelled"]
        assert pane.panel("steered").border_title == "(cancelled) steered 0.4x · calm (caa, layer 3)"
        assert pane.panel("baseline").border_title == "(not run) unsteered"
        assert message(pane) == ""
        progress = pane.query_one(JobProgress).plain
        assert "cancelled at" in progress and "100%" not in progress
        await pilot.press("g")
        await settle(app, pilot)
        assert pane.panel("steered").text == CALM

    drive(Settings(vector=calm), scenario, store)


def test_without_an_artifact_only_the_baseline_runs() -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await pilot.press("g")
        await settle(app, pilot)
        assert [h.request.vector for h in generations(app)] == [None]
        assert pane.panel("baseline").text == UNSTEERED
        assert pane.panel("steered").text == ""
        assert message(pane) == NO_ARTIFACT
        assert isinstance(pane.panel("steered"), TextPanel)

    drive(Settings(), scenario)


def test_generated_text_is_copied_and_saved_from_the_keyboard(calm: Path, tmp_path: Path) -> None:
    from ster.tui.screens.dialogs import AskText, Confirm

    target = tmp_path / "out" / "calm.txt"

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        await pilot.press("c")  # nothing focused in particular: the prompt and both texts, labelled
        assert app.clipboard == (f"prompt: {PROMPT_TEXT}\n\n[unsteered]\n{UNSTEERED}\n\n"
                                 f"[steered 0.4x · calm (caa, layer 3)]\n{CALM}\n")
        pane.panel("steered").focus()
        await pilot.press("c")  # the focused panel's text alone
        assert app.clipboard == CALM
        await pilot.press("s")
        assert isinstance(app.screen, AskText)
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        assert target.read_text() == CALM + "\n"
        assert message(pane) == f"saved {len(CALM)} characters to {target}"
        pane.panel("baseline").focus()
        await pilot.press("s")
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)  # an existing file is replaced only when the person says so
        await pilot.press("n")
        assert target.read_text() == CALM + "\n"
        await pilot.press("s")
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert target.read_text() == UNSTEERED + "\n"
        assert [p.name for p in target.parent.iterdir()] == ["calm.txt"]  # no temporary file left beside it

    drive(Settings(vector=calm), scenario)


def test_a_model_switch_marks_the_sweep_and_the_texts_as_older(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH, strengths="0.4x")
        await pilot.press("g", "w")
        await settle(app, pilot)
        assert "swept calm (caa, layer 3) on ster:toy" in str(pane.query_one("#caption", Static).content)
        app._model_chosen({"model": "ster:toy-chat", "precision": "f32", "device": "cpu", "chat_template": "auto"})
        await pilot.pause()
        caption = str(pane.query_one("#caption", Static).content)
        assert caption.startswith("older sweep (the model has changed since): swept calm (caa, layer 3) on ster:toy")
        assert pane.panel("steered").border_title.startswith("(older) steered 0.4x")
        assert pane.panel("baseline").border_title == "(older) unsteered"

    drive(Settings(vector=calm), scenario)
