"""The app as a whole, on the real engine and the bundled toy: Train, Jobs, cancel, quit, help, model switch."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Input, Static

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.tui.app import SterApp
from ster.tui.settings import Settings
from ster.tui.widgets.status import StatusLine
from tests.conftest import REPO
from tests.tui.tui_helpers import screen_text, settle, until

PAIRS = EXAMPLES_DIR / "pairs.json"


def cell_text(table: DataTable, row: int, column: int) -> str:
    value = table.get_cell_at((row, column))
    return value.plain if isinstance(value, Text) else str(value)


def message(app: SterApp, pane: str) -> str:
    widget = app.query_one(f"#{pane}-pane #message", Static)
    return str(widget.render())


def test_optimize_shows_exactly_one_selected_candidate_and_the_separation_that_ranked_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = SterApp(Settings(pairs=PAIRS))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("2")
            app.query_one("#output", Input).value = str(tmp_path / "calm.json")
            await pilot.press("escape", "o")
            await settle(pilot, app)
            table = app.query_one("#candidates", DataTable)
            assert table.row_count == 12
            assert [str(c.label) for c in table.columns.values()] == [
                "layer",
                "method",
                "holdout acc",
                "separation",
                "holdout margin",
                "selected",
            ]
            selected = [row for row in range(12) if cell_text(table, row, 5) == "✓"]
            assert len(selected) == 1
            written = json.loads((tmp_path / "calm.json").read_text())
            assert cell_text(table, selected[0], 0) == str(written["vectors"][0]["layer"]) == "2"
            assert cell_text(table, selected[0], 1) == written["method"] == "logistic"
            assert cell_text(table, selected[0], 3) == "2.488"  # the toy's best holdout separation
            title, plotted, marked, measure = app.query_one("#plot").drawn
            assert (title, marked, measure) == ("best candidate per layer", 2, "separation")
            assert [(layer, round(value, 3)) for layer, _, value in plotted] == [
                (0, 1.433),
                (1, 2.009),
                (2, 2.488),
                (3, 2.352),
            ]  # each layer's best is its logistic candidate
            assert app.settings.vector == tmp_path / "calm.json"
            title = str(app.query_one("#results-title", Static).render())
            assert "12 candidates ranked on a 3-pair holdout; selected logistic at layer 2" in title
            assert f"wrote {tmp_path / 'calm.json'}" in message(app, "train")
            await pilot.press("s")  # optimize's own ranking: the selected row first, still the only one ticked
            assert "by rank" in str(app.query_one("#results-title", Static).render())
            assert cell_text(table, 0, 5) == "✓" and sum(cell_text(table, r, 5) == "✓" for r in range(12)) == 1
            await pilot.press("s")  # by separation, largest first
            separations = [float(cell_text(table, row, 3)) for row in range(12)]
            assert separations == sorted(separations, reverse=True)

    asyncio.run(scenario())


def test_a_refused_job_shows_its_sentence_and_the_pane_stays_usable(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = SterApp(Settings(pairs=PAIRS))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("2")
            app.query_one("#layers", Input).value = "9"
            app.query_one("#output", Input).value = str(tmp_path / "never.json")
            await pilot.press("escape", "t")
            await settle(pilot, app)
            assert "layer 9 is out of range: this model has 4 layers, numbered 0..3" in message(app, "train")
            assert not (tmp_path / "never.json").exists()
            app.query_one("#layers", Input).value = "two"  # refused while the request is built
            await pilot.press("escape", "t")
            await settle(pilot, app)
            assert message(app, "train").startswith("layers takes all, a comma list such as 2,5")
            app.query_one("#layers", Input).value = "3"
            await pilot.press("escape", "t")
            await settle(pilot, app)
            assert (tmp_path / "never.json").exists()
            states = [handle.state for handle in app.runner.handles if handle.name == "train"]
            assert states == ["refused", "done"]

    asyncio.run(scenario())


def test_a_running_job_can_be_cancelled_and_writes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = SterApp(Settings(pairs=PAIRS))
        async with app.run_test(size=(140, 40)) as pilot:
            jobs = app.query_one("#jobs-pane")
            fields = {
                "model": "ster:toy",
                "trait": "calm",
                "opposite": "alarmed",
                "count": 2,
                "retry_multiplier": 20000,
                "output": tmp_path / "never.json",
            }
            handle = app.start_job("pairs synthesize", fields, jobs)
            assert handle is not None
            await until(pilot, lambda: handle.state == "running" and "attempt" in handle.last_message)
            await pilot.press("ctrl+x")
            await settle(pilot, app)
            assert handle.state == "cancelled"
            assert not (tmp_path / "never.json").exists()
            await pilot.press("6")
            table = app.query_one("#job-table", DataTable)
            row = table.get_row_index(str(handle.id))
            assert cell_text(table, row, 1) == "pairs synthesize" and cell_text(table, row, 2) == "cancelled"

    asyncio.run(scenario())


def test_quitting_while_a_job_runs_asks_then_cancels_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = SterApp(Settings(pairs=PAIRS))
        async with app.run_test(size=(140, 40)) as pilot:
            fields = {
                "model": "ster:toy",
                "trait": "calm",
                "opposite": "alarmed",
                "count": 2,
                "retry_multiplier": 20000,
                "output": tmp_path / "never.json",
            }
            handle = app.start_job("pairs synthesize", fields, app.query_one("#jobs-pane"))
            await until(pilot, lambda: handle.state == "running")
            await pilot.press("q")
            await pilot.pause(0.1)
            assert type(app.screen).__name__ == "Confirm"
            await pilot.press("n")  # keep working
            await pilot.pause(0.1)
            assert handle.state == "running" and type(app.screen).__name__ != "Confirm"
            await pilot.press("q")
            await pilot.pause(0.1)
            await pilot.press("y")
            await settle(pilot, app)
            assert handle.state == "cancelled"
        assert not (tmp_path / "never.json").exists()

    asyncio.run(scenario())


def test_help_lists_every_tab_and_the_model_dialog_switches_models() -> None:
    async def scenario() -> None:
        app = SterApp()
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            text, scroll = screen_text(app), app.screen.query_one(VerticalScroll)
            while scroll.scroll_y < scroll.max_scroll_y:  # page by page: the sections outgrow two screens
                scroll.scroll_page_down(animate=False)
                await pilot.pause(0.1)
                text += screen_text(app)
            for section in (
                "Everywhere",
                "Pairs tab",
                "Train tab",
                "Generate tab",
                "Tune tab",
                "Adapters tab",
                "Jobs tab",
            ):
                assert section in text
            assert "Optimize" in text and "Cancel job" in text
            await pilot.press("escape", "m")
            await pilot.pause(0.1)
            model = app.screen.query_one("#model", Input)
            model.value = "ster:toy-chat"
            await pilot.press("enter")
            await pilot.pause(0.1)
            assert app.settings.model == "ster:toy-chat"
            assert "ster:toy-chat" in app.query_one(StatusLine).plain

    asyncio.run(scenario())


@pytest.mark.parametrize("app", ["SterApp()", "SterApp(remote=Remote('http://127.0.0.1:9'))"])
def test_the_first_paint_imports_no_torch(app: str) -> None:
    """Neither with a local engine nor with a server (ster tui --server), whose client must not need torch."""
    code = f"""
import asyncio, sys
from ster.serve.client import Remote
from ster.tui.app import SterApp
async def main():
    app = {app}
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        print("TORCH" if "torch" in sys.modules else "NO TORCH")
        print("PLOTEXT" if "textual_plotext" in sys.modules else "NO PLOTEXT")  # the Tune tab's curves, drawn later
asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "NO TORCH" in proc.stdout and "NO PLOTEXT" in proc.stdout, proc.stderr


def test_the_first_paint_builds_only_the_first_tab() -> None:
    """The Train, Generate and Tune panes are neither imported nor mounted for the first screen, nor the pair
    models (and the validation library under them) imported for its first frame; each pane is there, whole, the
    first time its tab is shown."""
    code = """
import asyncio, sys
from ster.tui.app import SterApp
LAZY = ("ster.tui.widgets.train", "ster.tui.widgets.generate", "ster.tui.widgets.tune", "ster.tui.widgets.adapters")
class First(SterApp):
    def _display(self, screen, renderable):
        if renderable is not None and not getattr(self, "framed", False):
            self.framed = True
            print("validation library at the first frame:", "pydantic" in sys.modules)
        super()._display(screen, renderable)
    def on_mount(self):
        self.call_after_refresh(self.painted)  # before the app's own after-paint work
        super().on_mount()
    def painted(self):
        print("imported at first paint:", [m for m in LAZY if m in sys.modules])
        print("mounted at first paint:", [p.id for p in self.query("TabPane > *")])
async def main():
    app = First()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        print("after 4:", app.query_one("#tune-pane").display, app.query_one("#objective").value)
asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "imported at first paint: []" in proc.stdout, proc.stdout + proc.stderr
    assert "validation library at the first frame: False" in proc.stdout, proc.stdout + proc.stderr
    assert "mounted at first paint: ['pairs-pane', 'jobs-pane']" in proc.stdout, proc.stdout + proc.stderr
    assert "after 4: True sft" in proc.stdout, proc.stdout + proc.stderr
