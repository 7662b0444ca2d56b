"""The Tune pane on the real engine and the toy: a run's curve gains a point per optimizer step, the report
and the adapter's path appear at the end, DPO starts at ln 2, a cancelled run resumes to the adapter an
uninterrupted run writes, and bad values are refused in the form's words before anything runs."""

from __future__ import annotations

import asyncio
import math
import re
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Select, Static

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.engine.tune.checkpoint import checkpoint_path
from ster.engine.tune.requests import DpoRequest, GrpoRequest, RewardRequest, SftRequest
from ster.tui.app import SterApp
from ster.tui.runner import JobHandle
from ster.tui.settings import Settings
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.tune import FORM, MORE, TunePane, checkpoint_of
from tests.tui.tui_helpers import screen_text, settle, until

PAIRS = EXAMPLES_DIR / "pairs.json"
Scenario = Callable[[SterApp, Pilot, TunePane], Awaitable[None]]


def drive(scenario: Scenario, size: tuple[int, int] = (120, 34), settings: Settings | None = None) -> None:
    async def run() -> None:
        app = SterApp(settings or Settings(pairs=PAIRS, trait="calm"))
        async with app.run_test(size=size) as pilot:
            await pilot.press("4")
            await pilot.pause()
            await scenario(app, pilot, app.query_one(TunePane))

    asyncio.run(run())


def message(pane: TunePane) -> str:
    widget = pane.query_one("#message", Static)
    return str(widget.render()) if widget.display else ""


def tune_jobs(app: SterApp) -> list[JobHandle]:
    return [handle for handle in app.runner.handles if handle.name.startswith("tune ")]


async def fill(pilot: Pilot, pane: TunePane, objective: str = "sft", **values: str) -> None:
    pane.query_one("#objective", Select).value = objective
    await pilot.pause()
    for name, value in values.items():
        pane.query_one(f"#{name}").value = value
    pane.query_one(Curves).focus()  # the pane's keys, not a field's typing
    await pilot.pause()


def test_the_form_starts_at_each_objectives_request_defaults() -> None:
    """What each field shows, objective by objective, is what its request model holds (read here through the
    models, the form reading them itself): a default that changes there changes here."""
    requests = {"sft": SftRequest, "dpo": DpoRequest, "ipo": DpoRequest, "reward": RewardRequest, "grpo": GrpoRequest}

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        for objective, request in requests.items():
            await fill(pilot, pane, objective)
            fields, checked = request.model_fields, 0
            for name in (*FORM, *MORE):
                field = "iterations" if (objective, name) == ("grpo", "epochs") else name.replace("-", "_")
                if field not in fields:
                    continue
                shown, default = pane.query_one(f"#{name}").value, fields[field].default
                assert (float(shown) if isinstance(default, int | float) else shown) == default, (objective, name)
                checked += 1
            assert checked >= 12, objective

    drive(scenario)


def test_a_default_changed_in_the_request_model_is_the_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    from ster.tui.widgets import tune

    monkeypatch.setattr(SftRequest.model_fields["rank"], "default", 5)
    monkeypatch.setattr(GrpoRequest.model_fields["group"], "default", 6)
    tune.own_defaults.cache_clear()  # read again from the models now, and once more after the test
    tune.defaults.cache_clear()

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        assert pane.query_one("#rank").value == "5"
        await fill(pilot, pane, "grpo")
        assert pane.query_one("#group").value == "6" and pane.query_one("#rank").value == "8"

    try:
        drive(scenario)
    finally:
        tune.own_defaults.cache_clear()
        tune.defaults.cache_clear()


MORE_VALUES = {
    "seed": "7",
    "layers": "1,3",
    "warmup-steps": "2",
    "checkpoint-every": "3",
    "max-sequence": "256",
    "batch-size": "2",
    "temperature": "0.7",
    "top-p": "0.8",
    "max-new-tokens": "16",
}


@pytest.mark.parametrize("objective", ["sft", "dpo", "reward", "grpo"])
def test_more_settings_reach_the_request_of_each_objective(objective: str) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        more = pane.query_one("#more")
        assert more.collapsed and str(more.title) == "more settings"
        data = {"sft": "ster:examples", "grpo": "ster:grpo-prompts"}.get(objective, "ster:pairs")
        await fill(pilot, pane, objective, data=data, **MORE_VALUES)
        grpo = objective == "grpo"
        assert pane.query_one("#batch-size").display != grpo and pane.query_one("#top-p").parent.display == grpo
        fields = pane.fields()
        assert fields is not None, message(pane)
        request = build_job_request(pane_job(objective), **fields)
        assert (
            request.seed,
            request.layers,
            request.warmup_steps,
            request.checkpoint_every,
            request.max_sequence,
        ) == (7, "1,3", 2, 3, 256)
        if grpo:
            assert (request.temperature, request.top_p, request.max_new_tokens) == (0.7, 0.8, 16)
            assert request.batch_size == 1 and "batch" not in str(more.title)
        else:
            assert request.batch_size == 2 and "temperature" not in fields
        title = str(more.title)  # folded, the title says what differs
        assert title.startswith("more settings: seed 7, layers 1,3, warmup steps 2, checkpoint every 3"), title

    drive(scenario)


def pane_job(objective: str) -> str:
    from ster.tui.widgets.tune import JOBS

    return JOBS[objective]


def test_switching_the_objective_moves_defaults_and_keeps_typed_values_and_each_kind_of_data() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "sft", data="ster:examples", rank="4")
        await fill(pilot, pane, "grpo")
        assert pane.query_one("#accumulation").value == "1"
        assert pane.query_one("#beta").value == "0.04" and pane.query_one("#beta").display
        assert pane.query_one("#rank").value == "4"  # typed: it stays
        assert pane.query_one("#data").value == ""  # prompts, not the examples
        assert str(pane.query_one("#data-label").render()) == "prompts"
        assert str(pane.query_one("#epochs-label").render()) == "iterations"
        await fill(pilot, pane, "sft")
        assert pane.query_one("#data").value == "ster:examples"
        assert not pane.query_one("#beta").display and not pane.query_one("#group").parent.display
        await fill(pilot, pane, "dpo")
        assert "pairs.json" in pane.query_one("#data").placeholder
        assert pane.query_one("#output").placeholder.endswith("calm.dpo.ster-toy.safetensors")

    drive(scenario)


def test_an_sft_run_draws_a_point_per_step_and_ends_with_its_report_and_adapter(tmp_path: Path) -> None:
    out = tmp_path / "facts.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "sft", data="ster:examples", epochs="3", accumulation="4", output=str(out))
        pane.query_one("#more").collapsed = False
        await pilot.press("t")
        curves = pane.query_one(Curves)
        await until(pilot, lambda: len(curves.points.get("loss", [])) >= 1, 120)
        assert curves.plot is not None  # drawn from the first step
        assert pane.query_one("#more").collapsed  # the curves take the room
        await settle(pilot, app, 120)
        report = pane.report["report"]
        assert report["steps"] == 6 == len(curves.points["loss"]) == len(curves.points["learning_rate"])
        assert [step for step, _ in curves.points["loss"]] == list(range(1, 7))
        assert curves.points["loss"][-1][1] == report["final_loss"]
        assert out.is_file() and out.with_suffix(".json").is_file()
        text = message(pane)
        assert "sft done: 6 steps over 3 epochs" in text and f"{report['final_loss']:.4f}" in text
        assert str(out) in text
        assert pane.query_one(JobProgress).state == "done"
        screen = screen_text(app)
        assert "tokens/s" in screen and "6/6" in screen

    drive(scenario)


def test_a_dpo_run_on_the_apps_pair_set_starts_at_ln_2(tmp_path: Path) -> None:
    out = tmp_path / "calm.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "dpo", output=str(out), epochs="2", accumulation="4")
        await pilot.press("t")
        await settle(pilot, app, 120)
        curves = pane.query_one(Curves)
        assert curves.points["loss"][0][1] == pytest.approx(math.log(2), abs=1e-6)
        assert len(curves.points["accuracy"]) == len(curves.points["loss"]) == pane.report["report"]["steps"]
        assert re.search(r"first loss +0\.6931", screen_text(app))
        assert "accuracy" in message(pane) and "reward margin" in message(pane)
        margins = curves.points["reward_margin"]
        assert len(margins) == len(curves.points["loss"]) and margins[0][1] == 0.0  # the identity ranks nothing
        assert curves.second == "accuracy"
        await pilot.press("c")
        assert curves.second == "reward_margin" and "reward margin" in screen_text(app)
        assert pane.report["report"]["pairs"] == 12  # the Pairs tab's set

    drive(scenario)


def test_a_cancelled_run_leaves_a_checkpoint_and_r_resumes_it_to_the_uninterrupted_adapter(
    tmp_path: Path, paced_training: None
) -> None:
    out, whole = tmp_path / "cut" / "a.safetensors", tmp_path / "whole" / "a.safetensors"
    common = {"model": "ster:toy", "examples": "ster:examples", "epochs": 30, "accumulation": 1, "learning_rate": 5e-3}
    final = run_job(
        "tune sft", build_job_request("tune sft", **common, output=whole), lambda _: None, threading.Event()
    )
    assert final.type == "result", final

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "sft", data="ster:examples", epochs="30", accumulation="1", output=str(out))
        pane.query_one("#learning-rate").value = "5e-3"
        await pilot.press("r")  # nothing to resume yet
        await pilot.pause()
        assert "no checkpoint" in message(pane) and not tune_jobs(app)
        await pilot.press("t")
        curves = pane.query_one(Curves)
        await until(pilot, lambda: len(curves.points.get("loss", [])) >= 3, 120)
        await pilot.press("ctrl+x")
        await settle(pilot, app, 120)
        assert tune_jobs(app)[-1].state == "cancelled"
        stopped = len(curves.points["loss"])
        assert 3 <= stopped < 240 and checkpoint_of(out) == checkpoint_path(out) and checkpoint_of(out).is_file()
        assert not out.exists()
        text = message(pane)
        assert f"cancelled after step {stopped} of 240" in text and "r resumes" in text
        assert str(checkpoint_of(out)) in text
        await pilot.press("r")
        await settle(pilot, app, 240)
        assert tune_jobs(app)[-1].state == "done", message(pane)
        assert [step for step, _ in curves.points["loss"]] == list(range(1, 241))  # the curve carried on
        assert out.read_bytes() == whole.read_bytes()
        assert not checkpoint_of(out).exists()
        assert pane.report["report"] == final.data["report"]

    drive(scenario)


@pytest.mark.parametrize(
    ("field", "value", "sentence"),
    [
        ("learning-rate", "0", "supervised fine-tuning requires a finite learning rate above zero"),
        ("epochs", "two", 'epochs must be a whole number; got "two"'),
        ("targets", "qq", 'unknown adapter target "qq"'),
        ("group", "1", "requires a group of at least two completions"),
        ("seed", "-1", "seed must be between 0 and 18446744073709551615"),
        ("layers", "2-", "layers takes all, a comma list"),
        ("warmup-steps", "x", 'warmup steps must be a whole number; got "x"'),
        ("checkpoint-every", "-2", "checkpoint every must be 0 or more"),
        ("max-sequence", "1", "max sequence must be at least two tokens"),
        ("batch-size", "0", "supervised fine-tuning requires a batch of at least one example"),
        ("temperature", "0", "requires a temperature above zero"),
        ("top-p", "1.5", "top-p must be above 0 and at most 1"),
        ("max-new-tokens", "0", "max new tokens must be greater than zero"),
        ("output", "x.json", "adapter x.json ends in .json, which is where its sidecar goes"),
    ],
)
def test_a_bad_value_is_refused_by_the_requests_check_in_the_forms_words_before_anything_runs(
    field: str, value: str, sentence: str
) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        grpo = field in ("group", "temperature", "top-p", "max-new-tokens")
        objective, data = ("grpo", "ster:grpo-prompts") if grpo else ("sft", "ster:examples")
        await fill(pilot, pane, objective, data=data, **{field: value})
        await pilot.press("t")
        await pilot.pause(0.2)
        assert sentence in message(pane)
        assert not tune_jobs(app)  # nothing ran
        assert "--" not in message(pane)
        if field in MORE:
            assert not pane.query_one("#more").collapsed  # the bad field in sight

    drive(scenario)


def test_a_run_the_engine_refuses_leaves_more_settings_open() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "sft", data="ster:examples", layers="9")
        pane.query_one("#more").collapsed = False
        await pilot.press("t")
        await settle(pilot, app, 60)
        assert "layer 9 is out of range: this model has 4 layers, numbered 0..3" in message(pane)
        assert not pane.query_one("#more").collapsed  # the field to fix in sight

    drive(scenario)


def test_sft_without_examples_says_what_to_name() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, "sft")
        await pilot.press("t")
        await pilot.pause()
        assert "examples: name the training data" in message(pane) and "ster:examples" in message(pane)
        assert not tune_jobs(app)

    drive(scenario)


@pytest.mark.parametrize("objective", ["sft", "dpo", "grpo"])
def test_the_tune_tab_fits_80_by_24(objective: str) -> None:
    from textual.geometry import Region

    async def scenario(app: SterApp, pilot: Pilot, pane: TunePane) -> None:
        await fill(pilot, pane, objective)
        counts = []
        for collapsed, room in ((True, 8), (False, 5)):  # the more settings folded, then open
            pane.query_one("#more").collapsed = collapsed
            await pilot.pause()
            screen, shown = Region(0, 0, *app.size), 0
            for widget in pane.query("Field, Select, #progress, #curves"):
                if all(node.display for node in widget.ancestors_with_self if node not in (app, app.screen)):
                    shown += 1
                    assert widget.region.width >= 4 and screen.contains_region(widget.region), (widget, widget.region)
            counts.append(shown)
            assert pane.query_one(Curves).region.height >= room  # room for a plot, not a sliver
        assert counts[0] >= 11 and counts[1] - counts[0] == len(pane._shown_more()) >= 6, counts

    drive(scenario, size=(80, 24))
