"""The Adapters tab on the real engine and the toy: a tune run's adapter is listed and becomes the current
adapter, a cancelled run's checkpoint is listed as one, and a loaded adapter is inspected, evaluated against
the base model (the numbers the headless job reports), merged into a model directory that loads, exported
as a PEFT directory, and made the current adapter; a bad path is one sentence and writes nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.tui.app import SterApp
from ster.tui.screens.dialogs import AskText, Confirm
from ster.tui.settings import Settings
from ster.tui.widgets.adapters import AdaptersPane
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.status import StatusLine
from ster.tui.widgets.tune import TunePane, checkpoint_of
from tests.tui.test_tui_jobs_tune import start_sft
from tests.tui.tui_helpers import screen_text, settle, until

Scenario = Callable[[SterApp, Pilot, AdaptersPane], Awaitable[None]]


def headless(job: str, **fields: Any) -> dict[str, Any]:
    """The result document of ``job`` run by the engine directly, as the CLI would run it."""
    final = run_job(job, build_job_request(job, **fields), lambda _: None, threading.Event())
    assert final.type == "result", final
    return final.data


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sft adapter on the toy, written by the engine (as ``ster tune sft`` writes it)."""
    path = tmp_path_factory.mktemp("adapter") / "facts.safetensors"
    headless(
        "tune sft",
        model="ster:toy",
        examples="ster:examples",
        output=path,
        epochs=1,
        accumulation=4,
        max_sequence=64,
        learning_rate=5e-3,
    )
    return path


def drive(scenario: Scenario, size: tuple[int, int] = (80, 24), tab: str = "5") -> None:
    async def run() -> None:
        app = SterApp(Settings(pairs=EXAMPLES_DIR / "pairs.json", trait="calm"))
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await pilot.press(tab)
            await pilot.pause()
            await scenario(app, pilot, await app.pane("adapters"))

    asyncio.run(run())


def message(pane: AdaptersPane) -> str:
    widget = pane.query_one("#message", Static)
    return str(widget.render()) if widget.display else ""


def detail(pane: AdaptersPane) -> str:
    return " ".join(pane.detail_text.split())


def row(pane: AdaptersPane, at: int = 0) -> list[str]:
    table = pane.query_one(DataTable)
    return [str(cell) for cell in table.get_row_at(at)]


async def answer(pilot: Pilot, text: str | None = None) -> None:
    """Answer the dialog the pane asked: type ``text`` (or keep its default) and press enter."""
    await until(pilot, lambda: isinstance(pilot.app.screen, AskText))
    if text is not None:
        pilot.app.screen.query_one("#answer").value = text
    await pilot.press("enter")
    await pilot.pause()


async def load(pilot: Pilot, app: SterApp, path: Path) -> None:
    await pilot.press("o")
    await answer(pilot, str(path))
    await settle(pilot, app, 60)


def test_a_tune_run_made_in_the_app_is_listed_and_becomes_the_current_adapter(tmp_path: Path) -> None:
    out = tmp_path / "a.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await start_sft(pilot, app.query_one(TunePane), out, epochs="1", accumulation="4")
        await settle(pilot, app, 120)
        report = app.query_one(TunePane).report["report"]
        entry = app.adapters.get(out)
        assert entry is not None and (entry.kind, entry.objective, entry.model) == ("adapter", "sft", "ster:toy")
        assert entry.summary == f"loss {report['final_loss']:.4f}"
        assert app.settings.adapter == out and app.settings.adapter_info["objective"] == "sft"
        assert "adapter a " in app.query_one(StatusLine).plain  # the status line names what Generate compares
        await pilot.press("5")
        await pilot.pause()
        cells = row(pane)
        assert cells[:4] == ["●", "sft", "ster:toy", f"loss {report['final_loss']:.4f}"]
        assert cells[4] in ("a", str(out))  # the file name when the path is wider than the column

    drive(scenario, tab="4")


def test_a_cancelled_run_is_listed_as_its_checkpoint_and_is_not_used(tmp_path: Path, paced_training: None) -> None:
    out = tmp_path / "a.safetensors"

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        tune = app.query_one(TunePane)
        await start_sft(pilot, tune, out, epochs="30", accumulation="1")
        curves = tune.query_one(Curves)
        await until(pilot, lambda: len(curves.points.get("loss", [])) >= 2, 120)
        await pilot.press("ctrl+x")
        await settle(pilot, app, 120)
        stopped = len(curves.points["loss"])
        entry = app.adapters.get(checkpoint_of(out))
        assert entry is not None and entry.kind == "checkpoint" and checkpoint_of(out).is_file()
        assert app.adapters.get(out) is None and app.settings.adapter is None
        await pilot.press("5")
        await pilot.pause()
        assert row(pane)[:4] == ["", "sft ckpt", "ster:toy", f"checkpoint, step {stopped}/240"]
        await pilot.press("u")
        await pilot.pause()
        assert "checkpoint, not an adapter" in message(pane) and app.settings.adapter is None
        assert "a.safetensors.checkpoint" in screen_text(app)

    drive(scenario, tab="4")


def test_o_loads_an_adapter_inspect_shows_its_tensors_and_u_uses_it(adapter: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, adapter)
        entry = app.adapters.get(adapter)
        assert entry is not None and (entry.kind, entry.objective, entry.origin) == ("adapter", "sft", "loaded")
        assert message(pane).startswith("loaded the adapter")
        text = detail(pane)
        assert "16 tensors" in text and "rank 8, alpha 16 (scale 2)" in text
        inspected = headless("tune inspect", artifact=adapter)["adapter"]
        for tensor in inspected["tensors"]:
            assert f"{tensor['name']} {' × '.join(map(str, tensor['shape']))} {tensor['dtype']}" in text
        assert app.settings.adapter is None and row(pane)[0] == ""
        await pilot.press("u")
        await pilot.pause()
        assert app.settings.adapter == adapter and app.settings.adapter_info["kind"] == "adapter"
        assert row(pane)[0] == "●" and "the app's adapter is now facts" in message(pane)

    drive(scenario)


def test_evaluate_shows_the_base_model_and_the_adapter_in_the_headless_jobs_numbers(adapter: Path) -> None:
    base = headless("tune evaluate", model="ster:toy", examples="ster:examples")
    adapted = headless("tune evaluate", model="ster:toy", examples="ster:examples", adapter=adapter)

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, adapter)
        await pilot.press("e")
        await settle(pilot, app, 120)
        entry = app.adapters.get(adapter)
        assert entry is not None
        assert entry.evaluation["base"] == base and entry.evaluation["adapter"] == adapted
        assert [h.name for h in app.runner.handles[-2:]] == ["tune evaluate", "tune evaluate"]  # via the runner
        text = detail(pane)
        for label, data in (("base model", base), ("with adapter", adapted)):
            numbers = [
                f"{data[key]:.4f}" for key in ("loss", "perplexity", "mean_example_loss", "mean_example_perplexity")
            ]
            assert f"{label} {' '.join(numbers)}" in text
        assert "evaluated on ster:examples (toy-facts): 8 of 8 examples" in text

    drive(scenario)


def test_merge_writes_a_model_directory_that_loads_and_offers_it_as_the_model(adapter: Path) -> None:
    merged = adapter.parent / "facts.merged"
    if merged.exists():
        import shutil

        shutil.rmtree(merged)

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, adapter)
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, AskText))
        assert app.screen.query_one("#answer").value == str(merged)  # beside it
        await answer(pilot)
        await settle(pilot, app, 120)
        assert (merged / "model.safetensors").is_file() and (merged / "config.json").is_file()
        assert "merged 8 projections of facts.safetensors" in message(pane)
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.press("y")
        await pilot.pause()
        assert app.settings.model == str(merged)
        # The merged model loads, and scores the examples as the base model with the adapter does.
        scored = headless("tune evaluate", model=str(merged), examples="ster:examples")
        adapted = headless("tune evaluate", model="ster:toy", examples="ster:examples", adapter=adapter)
        assert scored["loss"] == pytest.approx(adapted["loss"], rel=1e-4)
        # Again into the same directory: asked first; no keeps it, yes replaces it.
        before = (merged / "model.safetensors").stat().st_mtime_ns
        await pilot.press("g")
        await answer(pilot)
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        assert "already holds a model directory" in str(app.screen.query_one("Label").render())
        await pilot.press("n")
        await pilot.pause()
        assert message(pane).startswith("kept") and (merged / "model.safetensors").stat().st_mtime_ns == before
        left = merged.parent / ".facts.merged.replaced"  # what an app killed mid-replace would have left: kept
        left.mkdir()
        (left / "keep.txt").write_text("mine")
        await pilot.press("g")
        await answer(pilot)
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.press("y")
        await settle(pilot, app, 120)
        assert app.runner.handles[-1].state == "done" and (merged / "model.safetensors").stat().st_mtime_ns != before
        assert (left / "keep.txt").read_text() == "mine"
        assert not (merged.parent / ".facts.merged.replaced1").exists()

    drive(scenario)


def test_export_writes_a_peft_directory_that_loads_back(adapter: Path) -> None:
    peft = adapter.parent / "facts.peft"

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, adapter)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, AskText))
        assert app.screen.query_one("#answer").value == str(peft)
        await answer(pilot)
        await settle(pilot, app, 60)
        assert sorted(p.name for p in peft.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        assert "exported facts.safetensors as a PEFT directory" in message(pane)
        await load(pilot, app, peft)
        entry = app.adapters.get(peft)
        assert entry is not None and entry.kind == "peft" and row(pane)[1] == "peft"
        assert "q_proj.lora_A.weight" in detail(pane) and "PEFT directory for ster:toy" in detail(pane)

    drive(scenario)


def test_a_bad_path_is_one_sentence_and_nothing_is_written(tmp_path: Path, adapter: Path) -> None:
    missing = tmp_path / "nothing.safetensors"
    (tmp_path / "taken").write_text("mine")

    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, missing)
        assert message(pane) == f"failed to read adapter {missing}: it does not exist"
        assert len(app.adapters) == 0
        await load(pilot, app, tmp_path)
        assert message(pane) == (
            f"directory {tmp_path} has no adapter_config.json, so it is not a PEFT adapter directory"
        )
        await pilot.press("e")
        await pilot.pause()
        assert message(pane).startswith("no adapter yet")
        await load(pilot, app, adapter)
        await pilot.press("g")
        await answer(pilot, str(tmp_path / "taken"))
        assert "is already there and is not a model directory" in message(pane)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and (tmp_path / "taken").read_text() == "mine"

    drive(scenario)


@pytest.mark.parametrize("size", [(80, 24), (120, 34)])
def test_the_adapters_tab_fits(size: tuple[int, int], adapter: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: AdaptersPane) -> None:
        await load(pilot, app, adapter)
        for selector in ("#adapter-table", "#examples", "#progress", "#detail"):
            widget = pane.query_one(selector)
            assert widget.region.width >= 20 and widget.region.height >= 1, selector
            assert app.screen.region.contains_region(widget.region), selector
        text = screen_text(app)
        for key in ("Load", "Inspect", "Eval", "Merge", "PEFT", "Use", "Help", "Quit"):
            assert key in text, key

    drive(scenario, size=size)


def test_the_book_follows_a_run_from_its_checkpoint_to_its_adapter() -> None:
    """Pure: a cancelled run's checkpoint row, then the same run resumed to its adapter (the row goes), an ipo
    run named by its loss, a reward model listed but not a generation adapter, a refusal adding nothing."""
    from ster.engine.protocol.events import Error, Result
    from ster.tui.adapters import AdapterBook, objective_of

    book, out = AdapterBook(), Path("/runs/calm.safetensors")
    fields = {"model": "ster:toy", "output": out, "loss": "ipo"}
    cancelled = Error(
        kind="cancelled",
        message=f"cancelled after step 3 of 18; the checkpoint at {out}.checkpoint continues it",
        details={"step": 3, "total": 18, "checkpoint": f"{out}.checkpoint"},
    )
    entry = book.from_tune_run("tune dpo", fields, cancelled)
    assert entry is not None and (entry.kind, entry.objective, entry.summary) == (
        "checkpoint",
        "ipo",
        "checkpoint, step 3/18",
    )
    assert not entry.usable and book.get(checkpoint_of(out)) is entry
    report = {"loss": "ipo", "final_loss": 24.5, "accuracy": 0.75}
    done = book.from_tune_run("tune dpo", fields, Result(command="tune dpo", data={"path": str(out), "report": report}))
    assert done is not None and [e.path for e in book.entries] == [out]
    assert (done.objective, done.summary, done.usable) == ("ipo", "loss 24.5000, acc 0.750", True)
    judge = book.from_tune_run(
        "tune reward",
        {"model": "ster:toy"},
        Result(command="tune reward", data={"path": "/runs/judge.safetensors", "report": {"final_loss": 0.69}}),
    )
    assert judge is not None and judge.kind == "reward" and not judge.usable
    assert book.from_tune_run("tune sft", fields, Error(kind="refused", message="no")) is None
    assert book.from_tune_run("tune evaluate", fields, Error(kind="refused", message="no")) is None
    assert len(book) == 2
    assert [
        objective_of(kind, report)
        for kind, report in [
            ("adapter", {"examples": 8}),
            ("adapter", {"loss": "dpo"}),
            ("adapter", {"mean_reward": 3.0}),
            ("reward", None),
            ("peft", None),
            ("adapter", None),
        ]
    ] == ["sft", "dpo", "grpo", "reward", "peft", "?"]
