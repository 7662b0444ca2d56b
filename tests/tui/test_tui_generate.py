"""The Generate pane on the real engine and the bundled toy checkpoint, driven through Pilot.

The toy is deterministic by construction, so its texts are pinned: unsteered, the town
floods; steered with the calm direction ``optimize`` picks (logistic at layer 2) at 0.4x, about
2.2 in the residual stream's units there, it is gentle.
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
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP, Strength
from ster.tui.app import SterApp
from ster.tui.messages import JobFinished
from ster.tui.settings import Settings
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
    code = main(
        [
            "optimize",
            "--model",
            "ster:toy",
            "--pairs",
            str(REPO / "ster/data/examples/pairs.json"),
            "--output",
            str(output),
        ]
    )
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


def drive(
    settings: Settings,
    scenario: Callable[[RecordingApp, Pilot, GeneratePane], Awaitable[None]],
    models: Any = None,
    size: tuple[int, int] = (140, 40),
) -> None:
    """Open the app on the Generate tab and run one scenario against it."""

    async def run() -> None:
        app = RecordingApp(settings, models)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()  # the app shows the Pairs tab once mounted; switch after that
            await app.action_show_tab("generate")
            pane = app.query_one(GeneratePane)
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
        # the baseline applies no artifact, so it carries no strength (the engine warns that one has no effect)
        assert [h.request.strength for h in generations(app)] == [Strength.model_validate(STRENGTH), None]
        assert steered.border_title == "steered 0.4x · calm (logistic, layer 2)"
        assert steered.border_subtitle.startswith("= 2.2 absolute · 8 tokens")
        assert baseline.border_title == "unsteered"
        assert "artifact calm (logistic, layer 2)" in app.query_one(StatusLine).plain
        assert app.settings.chat_decision == "absent"
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_a_narrow_panel_drops_the_method_and_layers_from_its_title_rather_than_cut_it(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        steered = pane.panel("steered")
        assert steered.title == "steered 0.4x · calm (logistic, layer 2)"  # what copy and save label it with
        assert steered.border_title == "steered 0.4x · calm"  # the status line names the method and layer
        assert "artifact calm (logistic, layer 2)" in app.query_one(StatusLine).plain
        app.settings.use_artifact(calm, None)
        app.settings_changed("artifact")
        await pilot.pause()
        assert steered.border_title == "(older) steered 0.4x · calm"

    drive(Settings(vector=calm), scenario, size=(80, 24))


def test_streamed_tokens_are_the_result_text(calm: Path) -> None:
    """The panels hold only what the token events carried; the results must say the same."""

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        by_vector = {
            final.data["vector"]: final.data["text"]
            for final in app.finals
            if final.type == "result" and final.command == "generate"
        }
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


ALARMED = [
    "question : tell me about the town . answer :",
    "question : tell me about the forest . answer :",
    "question : how is the market today ? answer :",
    "question : tell me about the bridge . answer :",
    "question : tell me about the hill . answer :",
    "question : tell me about the park . answer :",
]
"""Six toy prompts whose unsteered answers are alarmed, so pushing toward calm has somewhere to go."""


def sweep_rows(pane: GeneratePane) -> dict[str, list[str]]:
    """The sweep table's rows by their strength cell, each as the text of its cells."""
    table = pane.query_one(SweepTable)
    return {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}


def caption(pane: GeneratePane) -> str:
    return str(pane.query_one("#caption", Static).content)


def test_a_sweep_of_a_prompt_set_judges_each_effect_against_its_noise_and_opens_a_row(
    calm: Path, tmp_path: Path
) -> None:
    from ster.tui.screens.sweep_row import SweepRowDialog

    prompts = tmp_path / "alarmed.json"
    prompts.write_text(json.dumps({"prompts": ALARMED}))

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strengths=SWEEP, prompts=str(prompts))
        await pilot.press("w")
        await settle(app, pilot)
        [sweep] = [h for h in app.runner.handles if h.name == "sweep"]
        assert sweep.request.prompts == prompts and sweep.request.prompt_texts is None
        rows = sweep_rows(pane)
        assert list(rows) == ["-0.8x", "-0.4x", "0", "+0.4x", "+0.8x"]
        # strength, absolute, effect ± its noise band and a mark, changed, dist-2, run, tokens, judged, output
        assert rows["0"][2].strip() == "0" and rows["0"][8] == "baseline"
        assert rows["0"][3] == "0" and float(rows["+0.8x"][3]) > float(rows["+0.4x"][3]) > 0  # KL grows with the push
        assert rows["+0.4x"][1] == "2.2" and rows["+0.4x"][2] == "+0.467 ±0.25 ✓"  # beyond its noise
        assert rows["+0.4x"][4] == "5/6" and rows["+0.4x"][8] == "fluent ◀"  # the suggested strength
        assert rows["-0.4x"][2].strip() == "+0.108 ±0.19"  # within its noise: no mark
        assert rows["-0.8x"][2] == "+0.334 ±0.23 ↺"  # beyond its noise, but toward calm: against the push
        assert rows["+0.8x"][8] == "not fluent"
        assert rows["+0.4x"][9].startswith(f"{CALM} | ")  # every prompt's output, joined
        assert pane.query_one(SweepTable).streamed("+0.4x").startswith(f"{CALM} | ")  # what the tokens carried
        text = caption(pane)
        assert text.startswith(f"swept calm (logistic, layer 2) on ster:toy, 6 prompts of {prompts}: suggested +0.4x.")
        assert (
            "effect: how far the text moved along the direction, read back unsteered, minus the baseline's "
            "(residual-stream units): + toward calm, − away; ± its noise band (95%), ✓ beyond it, ↺ beyond it "
            "against the push."
        ) in text
        assert message(pane) == ""
        table = pane.query_one(SweepTable)
        table.focus()
        table.move_cursor(row=3)
        await pilot.press("enter")
        assert isinstance(app.screen, SweepRowDialog)
        shown = screen_text(app)
        assert "layer 2: 2.195" in shown and "+0.4672 (+0.0789 of the layers' activation norm)" in shown
        assert "the 95% band is" in shown and "±0.253" in shown and "nats a token over each neutral prompt" in shown
        assert "distinguishable from 0, on the side pushed" in shown
        assert "5 of 6 texts differ from their unsteered text" in shown and CALM in shown
        await pilot.press("u")
        assert pane.query_one("#strength", Input).value == "0.4x"
        assert message(pane) == "strength set to 0.4x; g generates at it"

    drive(Settings(vector=calm), scenario)


def test_a_sweep_of_the_one_prompt_says_why_it_suggests_nothing(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        assert pane.query_one("#prompts", Input).value == ""  # empty: the prompt above alone
        await form(pilot, pane, strengths=SWEEP)
        await pilot.press("w")
        await settle(app, pilot)
        [sweep] = [h for h in app.runner.handles if h.name == "sweep"]
        assert sweep.request.prompt_texts == [PROMPT_TEXT] and sweep.request.prompts is None
        rows = sweep_rows(pane)
        assert rows["+0.4x"][9] == CALM and rows["0"][9] == UNSTEERED
        assert rows["+0.4x"][2].strip() == "+0.514" and rows["+0.4x"][8] == "fluent"  # no noise band, no mark
        assert rows["-0.4x"][2].strip() == "0"  # the text did not change
        text = caption(pane)
        assert text.startswith(
            "swept calm (logistic, layer 2) on ster:toy, the prompt above: nothing suggested: one "
            "prompt gives an effect no noise to be told apart from; name a prompt set under prompts "
            "(a file, or ster:prompts) to sweep several."
        )
        assert "+ toward calm, − away." in text and "residual-stream units" in text
        assert message(pane) == ""  # the engine's warning is said once, by the caption

    drive(Settings(vector=calm), scenario)


def test_a_sweep_in_which_nothing_moved_says_so_in_the_caption(calm: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strengths="0.4x", prompts="ster:prompts", max_new_tokens="16")
        await pilot.press("w")
        await settle(app, pilot)
        assert sweep_rows(pane)["+0.4x"][2] == "+0.344 ±0.81  "
        assert (
            ": nothing suggested: no strength moved the text distinguishably from its noise: the largest effect, "
            "+0.344 at +0.4x, is within 0.814 of 0 over 4 prompts; try larger strengths, more prompts, or another "
            "layer. effect:"
        ) in caption(pane)
        assert caption(pane).startswith("swept calm (logistic, layer 2) on ster:toy, 4 prompts of ster:prompts:")
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_a_prompt_set_the_engine_cannot_read_is_refused_in_the_apps_words(calm: Path, tmp_path: Path) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, prompts="ster:nope")
        await pilot.press("w")
        await settle(app, pilot)
        assert message(pane).startswith("prompts: ster:nope is not a bundled example; the bundled examples are")
        assert [h for h in app.runner.handles if h.name == "sweep"] == []
        await form(pilot, pane, prompts=str(tmp_path / "missing.json"))
        await pilot.press("w")
        await settle(app, pilot)
        assert message(pane) == f"prompts {tmp_path / 'missing.json'} does not exist"
        assert "sweep refused" in caption(pane)

    drive(Settings(vector=calm), scenario)


def test_an_artifact_for_another_model_is_refused_before_anything_is_generated(calm: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({**json.loads(calm.read_text()), "model": "someone/other-model", "model_fingerprint": None})
    )

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


@pytest.mark.parametrize(
    ("field", "typed", "sentence"),
    [
        ("max-new-tokens", "0", "max tokens must be at least 1"),
        (
            "strength",
            "abc",
            "strength must be a number such as 3 or a multiple of each layer's activation spread such as "
            '0.4x; got "abc"',  # the request's own sentence
        ),
        ("temperature", "warm", 'temp (temperature) must be a number; got "warm"'),
        (
            "strengths",
            "0.4x,3",
            "sweep mixes absolute and relative strengths; give all of them as numbers (3) or all as multiples of "
            "the activation spread (0.4x)",
        ),
    ],
)
def test_a_bad_field_is_refused_in_the_forms_words_and_cleared_once_fixed(
    calm: Path, field: str, typed: str, sentence: str
) -> None:
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
        assert pane.panel("steered").border_title == "(cancelled) steered 0.4x · calm (logistic, layer 2)"
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
        assert [(h.request.vector, h.request.strength) for h in generations(app)] == [(None, None)]
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
        assert app.clipboard == (
            f"prompt: {PROMPT_TEXT}\n\n[unsteered]\n{UNSTEERED}\n\n[steered 0.4x · calm (logistic, layer 2)]\n{CALM}\n"
        )
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
        assert "swept calm (logistic, layer 2) on ster:toy" in str(pane.query_one("#caption", Static).content)
        app._model_chosen({"model": "ster:toy-chat", "precision": "f32", "device": "cpu", "chat_template": "auto"})
        await pilot.pause()
        caption = str(pane.query_one("#caption", Static).content)
        assert caption.startswith(
            "older sweep (the model has changed since): swept calm (logistic, layer 2) on ster:toy"
        )
        assert pane.panel("steered").border_title.startswith("(older) steered 0.4x")
        assert pane.panel("baseline").border_title == "(older) unsteered"

    drive(Settings(vector=calm), scenario)
