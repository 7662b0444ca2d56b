"""The Generate pane's three-way compare on the toy: base, a LoRA adapter, and steered on either.

The adapter is trained here, in-process, with the engine's own ``tune sft`` (three examples, one
epoch at a high learning rate: a few seconds), so that it really changes the toy's greedy text:
unsteered the town floods, through the adapter it is quiet, and the calm direction steers each
of the two differently. Every text the pane shows is checked against the same ``generate``
request run headless (``ster --json generate``), the independent check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static

from ster.cli import main
from ster.tui.settings import Settings
from ster.tui.widgets.generate import GeneratePane, SweepTable
from tests.tui.test_tui_generate import (
    CALM,
    PROMPT_TEXT,
    STRENGTH,
    UNSTEERED,
    RecordingApp,
    calm,  # noqa: F401  (the module's calm direction, as a fixture here too)
    drive,
    form,
    generations,
    message,
    settle,
)

TOWN = [
    {"prompt": f"question : tell me about the {place} . answer :", "completion": f"the {place} is quiet and we rest ."}
    for place in ("town", "forest", "lake")
]
SAMPLING = {"max_new_tokens": "48", "temperature": "0", "seed": "42"}
"""The pane's own defaults, which the headless requests repeat."""


@pytest.fixture(scope="session")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter for the toy that makes its towns quiet, trained by ``ster tune sft`` in-process."""
    folder = tmp_path_factory.mktemp("adapter")
    examples = folder / "town.json"
    examples.write_text(json.dumps({"examples": TOWN}))
    output = folder / "quiet.sft.safetensors"
    assert (
        main(
            [
                "tune",
                "sft",
                "--model",
                "ster:toy",
                "--examples",
                str(examples),
                "--output",
                str(output),
                "--learning-rate",
                "0.01",
                "--epochs",
                "1",
                "--accumulation",
                "1",
            ]
        )
        == 0
    )
    return output


def headless(cli: Any, **flags: Any) -> str:
    """The text ``ster --json generate`` gives for the pane's prompt and sampling, with these flags."""
    args = ["--json", "generate", "--model", "ster:toy", "--prompt", PROMPT_TEXT]
    for name, value in {**SAMPLING, **flags}.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    run = cli(*args)
    assert run.code == 0, run.err
    [result] = [json.loads(line) for line in run.out.splitlines() if '"type":"result"' in line.replace(" ", "")]
    return result["data"]["text"]


def texts(pane: GeneratePane) -> dict[str, str]:
    return {role: pane.panel(role).text for role in ("baseline", "adapted", "steered")}


def test_three_streams_side_by_side_each_as_the_headless_request_gives_it(
    calm: Path,  # noqa: F811 - the fixture of that name
    adapter: Path,
    cli: Any,
) -> None:
    shown: dict[str, dict[str, str]] = {}

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        assert pane.query_one("#adapter", Input).value == str(adapter)  # the app's current adapter
        assert all(pane.panel(role).display for role in ("baseline", "adapted", "steered"))
        assert "steered runs on it (o: on the base)" in str(pane.query_one("#steer-hint").content)
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        # one after another through the runner: steered (the one that can be refused) first, then the adapter
        assert [(h.request.vector, h.request.adapter) for h in generations(app)] == [
            (calm, adapter),
            (None, adapter),
            (None, None),
        ]
        assert [h.state for h in generations(app)] == ["done"] * 3
        assert pane.panel("baseline").border_title == "base · ster:toy"
        assert pane.panel("adapted").border_title == "adapter · quiet.sft"
        assert pane.panel("steered").title == "steered 0.4x · calm (logistic, layer 2) on quiet.sft"
        shown["on adapter"] = texts(pane)
        assert message(pane).startswith(
            "warning: this direction was fitted on the bare checkpoint and this run attaches adapter"
        )
        await pilot.press("o")  # the steered text on the base model now
        assert message(pane) == "g now steers on the base (o: on quiet.sft)"
        await pilot.press("g")
        await settle(app, pilot)
        assert [(h.request.vector, h.request.adapter) for h in generations(app)][3:] == [
            (calm, None),
            (None, adapter),
            (None, None),
        ]
        assert pane.panel("steered").title == "steered 0.4x · calm (logistic, layer 2) on the base"
        shown["on base"] = texts(pane)
        await pilot.press("c")
        assert app.clipboard == (
            f"prompt: {PROMPT_TEXT}\n\n[base · ster:toy]\n{UNSTEERED}\n\n"
            f"[adapter · quiet.sft]\n{shown['on base']['adapted']}\n\n"
            f"[steered 0.4x · calm (logistic, layer 2) on the base]\n{CALM}\n"
        )

    drive(Settings(vector=calm, adapter=adapter), scenario)
    on_adapter, on_base = shown["on adapter"], shown["on base"]
    assert on_adapter["baseline"] == on_base["baseline"] == headless(cli) == UNSTEERED
    assert on_adapter["adapted"] == on_base["adapted"] == headless(cli, adapter=adapter)
    assert on_adapter["steered"] == headless(cli, adapter=adapter, vector=calm, strength=STRENGTH)
    assert on_base["steered"] == headless(cli, vector=calm, strength=STRENGTH) == CALM
    assert len({on_adapter["baseline"], on_adapter["adapted"], on_adapter["steered"], on_base["steered"]}) == 4


def test_the_sweep_runs_through_the_adapter_and_says_so(calm: Path, adapter: Path) -> None:  # noqa: F811
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strengths="0.4x", max_new_tokens="16")
        await pilot.press("w")
        await settle(app, pilot)
        [sweep] = [h for h in app.runner.handles if h.name == "sweep"]
        assert sweep.fields["adapter"] == adapter and sweep.request.adapter == adapter
        caption = str(pane.query_one("#caption", Static).content)
        assert caption.startswith(
            "swept calm (logistic, layer 2) on ster:toy through the adapter quiet.sft, the prompt above:"
        )
        table = pane.query_one(SweepTable)
        assert [str(column.label) for column in table.columns.values()][-1] == "output through quiet.sft (enter: all)"
        await pilot.press("o", "w")  # steering on the base: so is the sweep
        await settle(app, pilot)
        sweep = [h for h in app.runner.handles if h.name == "sweep"][-1]
        assert "adapter" not in sweep.fields and sweep.request.adapter is None
        assert str(pane.query_one("#caption", Static).content).startswith(
            "swept calm (logistic, layer 2) on ster:toy, the prompt above:"
        )

    drive(Settings(vector=calm, adapter=adapter), scenario)


def test_the_adapter_field_follows_the_app_refuses_a_bad_path_and_can_be_none(
    calm: Path,  # noqa: F811
    adapter: Path,
    tmp_path: Path,
) -> None:
    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        assert pane.query_one("#adapter", Input).value == "" and not pane.panel("adapted").display
        await form(pilot, pane, adapter=str(tmp_path / "nope.safetensors"))
        await pilot.press("g")
        await settle(app, pilot)
        assert message(pane) == f"adapter {tmp_path / 'nope.safetensors'} does not exist"
        await form(pilot, pane, adapter=str(adapter.with_suffix(".json")))
        await pilot.press("g")
        await settle(app, pilot)
        assert (
            message(pane) == f"adapter {adapter.with_suffix('.json')} is the sidecar; name the adapter beside it, "
            f"{adapter.name}"
        )
        assert generations(app) == []  # nothing ran
        await form(pilot, pane, adapter="none")
        assert message(pane) == ""
        await pilot.press("o")
        assert message(pane).startswith("no adapter named above, so the steered text runs on the base model")
        app.settings.use_adapter(adapter)  # as the Adapters tab does
        app.settings_changed("adapter")
        await pilot.pause()
        assert pane.query_one("#adapter", Input).value == str(adapter) and pane.panel("adapted").display
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        assert len(generations(app)) == 3 and pane.panel("adapted").text
        app.settings.use_adapter(None)
        app.settings_changed("adapter")
        await pilot.pause()
        assert pane.query_one("#adapter", Input).value == ""
        assert pane.panel("adapted").border_title == "(older) adapter · quiet.sft"
        assert pane.panel("steered").border_title.startswith("(older) steered 0.4x")
        assert pane.panel("baseline").border_title == "base · ster:toy"  # the base text did not depend on it
        await pilot.press("g")  # no adapter: the two panels of old
        await settle(app, pilot)
        assert not pane.panel("adapted").display
        assert [(h.request.vector, h.request.adapter) for h in generations(app)][3:] == [(calm, None), (None, None)]
        assert pane.panel("baseline").border_title == "unsteered"
        assert pane.panel("steered").border_title == "steered 0.4x · calm (logistic, layer 2)"
        assert (pane.panel("baseline").text, pane.panel("steered").text) == (UNSTEERED, CALM)

    drive(Settings(vector=calm), scenario)


def test_an_adapter_for_another_model_leaves_the_runs_after_it_not_run(
    calm: Path,  # noqa: F811 - the fixture of that name
    adapter: Path,
    tmp_path: Path,
) -> None:
    other = tmp_path / "other.safetensors"
    other.write_bytes(adapter.read_bytes())
    sidecar = json.loads(adapter.with_suffix(".json").read_text())
    other.with_suffix(".json").write_text(
        json.dumps({**sidecar, "model": "someone/other-model", "model_fingerprint": None})
    )

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g")
        await settle(app, pilot)
        assert [h.state for h in generations(app)] == ["refused"]
        assert "someone/other-model" in message(pane)
        assert pane.panel("adapted").border_title == "(not run) adapter · other"
        assert pane.panel("baseline").border_title == "(not run) base · ster:toy"

    drive(Settings(vector=calm, adapter=other), scenario)


def test_a_cancelled_compare_leaves_the_runs_after_it_not_run(calm: Path, adapter: Path) -> None:  # noqa: F811
    from tests.tui.test_tui_generate import HeldStore

    store = HeldStore()

    async def scenario(app: RecordingApp, pilot: Pilot, pane: GeneratePane) -> None:
        await form(pilot, pane, strength=STRENGTH)
        await pilot.press("g", "ctrl+x")  # the steered run is held at its model load; the others wait for it
        store.release.set()
        await settle(app, pilot)
        assert [h.state for h in generations(app)] == ["cancelled"]
        assert pane.panel("steered").border_title.startswith("(cancelled) steered 0.4x")
        assert pane.panel("adapted").border_title == "(not run) adapter · quiet.sft"
        assert pane.panel("baseline").border_title == "(not run) base · ster:toy"

    drive(Settings(vector=calm, adapter=adapter), scenario, store)


def test_a_title_too_long_for_its_border_is_said_whole_inside_the_panel() -> None:
    """Three panels at 120 columns leave a steered panel about 38 wide; its border cuts a title such as
    'steered 0.4x · calm.optimized.ster-toy (logistic, layer 2) on calm.dpo.ster-toy', so the panel's first
    line says it whole above the text, and a short title stays in the border alone."""
    import asyncio

    from textual.app import App

    from ster.tui.widgets.generate_parts import TextPanel

    long = "steered 0.4x · calm.optimized.ster-toy (logistic, layer 2) on calm.dpo.ster-toy"

    class Panels(App[None]):
        def compose(self) -> Any:
            yield TextPanel(long, "…", id="long")
            yield TextPanel("base · ster:toy", "…", id="short")

    async def run() -> None:
        app = Panels()
        async with app.run_test(size=(38, 12)) as pilot:
            await pilot.pause()
            cut, short = app.query_one("#long", TextPanel), app.query_one("#short", TextPanel)
            cut.append("the town is gentle and we rest.")
            short.append("the town is flooding and we flee.")
            await pilot.pause()
            assert str(cut.border_title).endswith("…") or len(str(cut.border_title)) < len(long)
            body = str(cut.query_one(Static).render())
            assert body.startswith(long[:20]) and "calm.dpo.ster-toy" in body and body.endswith("we rest.")
            assert cut.text == "the town is gentle and we rest."  # copy and save take the text alone
            assert str(short.query_one(Static).render()) == "the town is flooding and we flee."

    asyncio.run(run())
