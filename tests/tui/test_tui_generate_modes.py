"""The Generate pane's mode on the toy: the calm direction added, ablated or clamped, through the app as
through the engine.

Each expected text is the engine's own, from the same request run directly (``run_job``), the independent
check of what the pane sent. On the toy, ablating the calm direction turns the burning hill calm; the town
floods whether it is ablated or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Select, Static

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import build_job_request, request_default, run_job
from ster.engine.protocol.naming import named
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP
from ster.engine.steering.sweep import ABLATION_SWEEP
from ster.tui.settings import Settings
from ster.tui.widgets.generate import GeneratePane, SweepTable
from ster.tui.words import LABELS
from tests.tui.test_tui_generate import (
    RecordingApp,
    calm,  # noqa: F401  (the module's calm direction, as a fixture here too)
    caption,
    drive,
    form,
    generations,
    message,
    settle,
    sweep_rows,
)
from tests.tui.test_tui_layout import on_screen, shows
from tests.tui.tui_helpers import screen_text

HILL = "question : tell me about the hill . answer :"
SAMPLING = {"max_new_tokens": "48", "temperature": "0", "seed": "42"}
"""The pane's own defaults, which the direct requests repeat."""


def engine(job: str, **fields: Any) -> dict[str, Any]:
    """The result of ``job`` run directly on the toy, as ``ster <job>`` gives it."""
    final = run_job(job, build_job_request(job, model="ster:toy", **SAMPLING, **fields), lambda _: None)
    assert final.type == "result", final
    return final.data


def refusal(job: str, **fields: Any) -> str:
    """The sentence the request of ``job`` refuses these fields in, naming them as the form labels them."""
    try:
        with named(LABELS):
            build_job_request(job, model="ster:toy", **fields)
    except Refusal as exc:
        return str(exc)
    raise AssertionError("the request passed")


async def choose(pilot: Pilot, pane: GeneratePane, mode: str) -> None:
    pane.query_one("#mode", Select).value = mode
    await pilot.pause()


def test_the_mode_starts_at_the_requests_default_and_ablating_gives_the_engines_text(calm: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        select = pane.query_one("#mode", Select)
        assert select.value == request_default("generate", "mode") == "add"
        select.focus()  # chosen from the keyboard: enter opens the list, down moves to ablate, enter takes it
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        assert select.value == pane.mode == "ablate"
        await form(pilot, pane, prompt=HILL)
        await pilot.press("escape", "g")
        await settle(app, pilot)
        steered, baseline = generations(app)
        assert steered.request.mode == "ablate" and str(steered.request.strength) == "1"  # the whole component
        assert "mode" not in baseline.fields and baseline.request.vector is None  # the baseline applies nothing
        expected = engine("generate", prompt=HILL, vector=calm, mode="ablate")
        assert pane.panel("steered").text == expected["text"] == "the hill is calm and we rest."
        assert (
            pane.panel("baseline").text == engine("generate", prompt=HILL)["text"] == "the hill is burning and we flee."
        )
        panel = pane.panel("steered")
        assert panel.title == "ablated (weight 1) · calm (logistic, layer 2)"
        assert panel.border_subtitle.startswith("embedding + blocks 0–3, layer 2's direction · ")
        assert message(pane) == ""

    drive(Settings(vector=calm), scenario)


def test_clamping_sends_the_target_and_says_it(calm: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await choose(pilot, pane, "clamp")
        await pilot.press("g")
        await settle(app, pilot)
        steered = generations(app)[0]
        assert steered.request.mode == "clamp" and str(steered.request.strength) == DEFAULT_STRENGTH
        expected = engine("generate", prompt=pane.prompt_used, vector=calm, mode="clamp", strength=DEFAULT_STRENGTH)
        assert pane.panel("steered").text == expected["text"]
        assert pane.panel("steered").title == f"clamped to {DEFAULT_STRENGTH} · calm (logistic, layer 2)"
        target = expected["edits"]["2"]["target"]
        assert pane.panel("steered").border_subtitle.startswith(f"= {target:.3g} absolute at embedding + blocks 0–3")

    drive(Settings(vector=calm), scenario)


def test_a_sweep_in_ablate_mode_walks_the_weights_and_opens_a_row(calm: Path) -> None:  # noqa: F811
    from ster.tui.screens.sweep_row import SweepRowDialog

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, prompt=HILL)
        await choose(pilot, pane, "ablate")
        assert pane.query_one("#strengths", Input).value == ABLATION_SWEEP
        await pilot.press("w")
        await settle(app, pilot)
        [sweep] = [h for h in app.runner.handles if h.name == "sweep"]
        assert sweep.request.mode == "ablate"
        expected = engine("sweep", prompt_texts=[HILL], vector=calm, mode="ablate", strengths=ABLATION_SWEEP)
        rows = sweep_rows(pane)
        assert list(rows) == ["0", "0.25", "0.5", "1"]  # weights, unsigned; 0 is the unedited model
        assert [rows[key][9] for key in rows] == [row["outputs"][0]["text"] for row in expected["rows"]]
        assert rows["1"][9] == "the hill is calm and we rest." and rows["0"][8] == "baseline"
        table = pane.query_one(SweepTable)
        assert str(table.ordered_columns[0].label) == "weight"
        assert caption(pane).startswith("swept calm (logistic, layer 2), ablated at each weight, on ster:toy")
        table.focus()
        table.move_cursor(row=2)
        await pilot.press("enter")
        assert isinstance(app.screen, SweepRowDialog)
        shown = screen_text(app)
        assert "sweep row at weight 0.5" in shown and "that share of the component along the direction" in shown
        await pilot.press("escape")
        await choose(pilot, pane, "add")  # "u" takes the row's weight into the form in the sweep's mode
        table.focus()
        await pilot.press("enter", "u")
        assert pane.mode == "ablate" and pane.query_one("#strength", Input).value == "0.5"
        assert message(pane) == "strength set to 0.5, mode ablate; g generates at it"

    drive(Settings(vector=calm), scenario)


def test_a_relative_weight_is_refused_before_anything_runs_in_the_requests_sentence(calm: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await choose(pilot, pane, "ablate")
        strength, sweep = pane.query_one("#strength", Input), pane.query_one("#strengths", Input)
        await form(pilot, pane, strength="0.4x")
        assert strength.has_class("-invalid")
        await pilot.press("g")
        await settle(app, pilot)
        sentence = refusal("generate", prompt=HILL, vector=calm, mode="ablate", strength="0.4x")
        assert message(pane) == sentence
        assert sentence.startswith("strength 0.4x is not a weight: with mode ablate") and "--" not in sentence
        await form(pilot, pane, strength="1", strengths="0.4x,0.8x")
        assert message(pane) == "" and sweep.has_class("-invalid")
        await pilot.press("w")
        await settle(app, pilot)
        assert message(pane) == refusal("sweep", prompt_texts=[HILL], vector=calm, mode="ablate", strengths="0.4x,0.8x")
        assert message(pane).startswith("sweep 0.4x is not a weight")
        assert [h for h in app.runner.handles if h.name in ("generate", "sweep")] == []

    drive(Settings(vector=calm), scenario)


def test_switching_modes_moves_untouched_defaults_and_keeps_typed_values(calm: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        strength, sweep = pane.query_one("#strength", Input), pane.query_one("#strengths", Input)
        assert (strength.value, sweep.value) == (DEFAULT_STRENGTH, DEFAULT_SWEEP)
        await choose(pilot, pane, "ablate")
        assert (strength.value, sweep.value) == ("1", ABLATION_SWEEP)  # generate's 1, sweep's walk of weights
        await choose(pilot, pane, "clamp")
        assert (strength.value, sweep.value) == (DEFAULT_STRENGTH, DEFAULT_SWEEP)
        await choose(pilot, pane, "add")
        assert (strength.value, sweep.value) == (DEFAULT_STRENGTH, DEFAULT_SWEEP)
        await form(pilot, pane, strength="0.3x", strengths="0.2x,0.6x")  # typed: they stay, checked again
        await choose(pilot, pane, "ablate")
        assert (strength.value, sweep.value) == ("0.3x", "0.2x,0.6x")
        assert strength.has_class("-invalid") and sweep.has_class("-invalid")
        await choose(pilot, pane, "clamp")
        assert (strength.value, sweep.value) == ("0.3x", "0.2x,0.6x")
        assert not strength.has_class("-invalid") and not sweep.has_class("-invalid")

    drive(Settings(vector=calm), scenario)


def test_the_keys_step_a_weight_by_tenths_never_below_0_and_an_adopted_strength_steers(calm: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        strength = pane.query_one("#strength", Input)
        await choose(pilot, pane, "ablate")
        await pilot.press("]", "}")
        assert strength.value == "1.11"
        await form(pilot, pane, strength="0.15")
        await pilot.press("[", "[", "{")
        assert strength.value == "0"
        app.settings.strength = "0.3x"  # a calibration front's point, adopted: a steering strength
        app.settings_changed("strength")
        await pilot.pause()
        assert pane.mode == "add" and pane.query_one("#mode", Select).value == "add"
        assert strength.value == "0.3x" and not strength.has_class("-invalid")

    drive(Settings(vector=calm), scenario)


@pytest.mark.parametrize("size", [(80, 24), (120, 34)])
def test_the_selector_fits_beside_the_prompt_at_80_by_24_and_120_by_34(calm: Path, size: tuple[int, int]) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        for mode in ("ablate", "clamp", "add"):
            await choose(pilot, pane, mode)
            select = pane.query_one("#mode", Select)
            assert select.region.y == pane.query_one("#prompt").region.y  # on the prompt's row
            label = select.query_one("#label", Static)
            assert shows(label) == mode and label.region.width >= len(mode)  # whole
            for widget in ("#mode", "#prompt", "#strength", "#seed", "#strengths", "#prompts", "#sweep"):
                on_screen(app, pane.query_one(widget), min_width=4)

    drive(Settings(vector=calm), scenario, size=size)
