"""The app at the sizes people use: every tab usable at 80×24, the keys that matter visible at 120
columns, fields that show their whole value, dialogs inside the screen, a Jobs table that follows the work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import DataTable

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.tui.app import SterApp
from ster.tui.screens.dialogs import Confirm
from ster.tui.settings import Settings
from ster.tui.widgets.fields import Field
from ster.tui.widgets.footer import KeyBar
from ster.tui.widgets.status import StatusLine
from tests.tui.tui_helpers import settle, until

PAIRS = EXAMPLES_DIR / "pairs.json"
Scenario = Callable[[SterApp, Pilot], Awaitable[None]]


def drive(size: tuple[int, int], scenario: Scenario, settings: Settings | None = None) -> None:
    async def run() -> None:
        app = SterApp(settings or Settings(pairs=PAIRS))
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app)
            await scenario(app, pilot)

    asyncio.run(run())


def on_screen(app: SterApp, widget: Widget, min_width: int = 1) -> None:
    """The widget is shown whole inside the screen (not cut at its edge, not 0 cells wide)."""
    screen = Region(0, 0, *app.size)
    assert widget.region.width >= min_width and widget.region.height >= 1, (widget, widget.region)
    assert screen.contains_region(widget.region), (widget, widget.region, app.size)


def shows(widget: Widget) -> str:
    """The text a one-line widget shows, as drawn (after any scrolling)."""
    return widget.render_line(0).text.strip()


VISIBLE = {
    "pairs": ("#summary", "#pairs-table", "#detail"),
    "train": ("#layers", "#method", "#output", "#eval-pairs", "#progress", "#candidates"),
    "generate": (
        "#prompt",
        "#mode",
        "#strength",
        "#max-new-tokens",
        "#temperature",
        "#seed",
        "#strengths",
        "#prompts",
        "#progress",
        "#baseline",
        "#steered",
        "#caption",
        "#sweep",
    ),
    "adapters": ("#adapter-table", "#examples", "#progress", "#detail"),
    "jobs": ("#job-table", "#events"),
}


@pytest.mark.parametrize("tab", list(VISIBLE))
def test_every_tab_fits_80_by_24(tab: str) -> None:
    async def scenario(app: SterApp, pilot: Pilot) -> None:
        await app.action_show_tab(tab)
        await pilot.pause(0.2)
        for selector in VISIBLE[tab]:
            on_screen(app, app.query_one(f"#{tab}-pane {selector}"), min_width=4)
        table = app.query_one(f"#{tab}-pane DataTable", DataTable)
        assert table.region.height >= 4  # a header and rows, not a sliver
        on_screen(app, app.query_one(StatusLine))

    drive((80, 24), scenario)


def test_number_fields_show_their_whole_value_with_the_sign() -> None:
    async def scenario(app: SterApp, pilot: Pilot) -> None:
        await app.action_show_tab("generate")
        await pilot.pause()
        strength = app.query_one("#strength", Field)
        strength.value = "3"
        await pilot.press(*"[[[[{{{{")
        assert (strength.value, shows(strength)) == ("-1.4", "-1.4")
        for field_id, typed in (
            ("max-new-tokens", "3000"),
            ("strengths", "-150,-75,75,150"),
            ("seed", "18446744073709551615"),
            ("strength", "-0.85x"),
            ("prompts", "ster:prompts"),
        ):
            field = app.query_one(f"#{field_id}", Field)
            field.focus()
            await pilot.press("ctrl+u", *typed, "escape")
            assert shows(field) == typed
            on_screen(app, field)

    drive((80, 24), scenario)


def test_the_status_line_keeps_the_running_job_at_80_columns(tmp_path: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot) -> None:
        app.settings.vector = tmp_path / "a-long-artifact-name-that-fills-the-line.ster.json"
        fields = {
            "model": "ster:toy",
            "trait": "calm",
            "opposite": "alarmed",
            "count": 2,
            "retry_multiplier": 20000,
            "output": tmp_path / "never.json",
        }
        handle = app.start_job("pairs synthesize", fields, app.query_one("#jobs-pane"))
        await until(pilot, lambda: handle is not None and handle.step is not None and handle.step.stage != "")
        await pilot.pause(0.1)
        line = shows(app.query_one(StatusLine))
        assert "pairs synthesize" in line and "%" in line
        assert line.startswith("model ster:toy")
        app.action_cancel_job()
        await settle(pilot, app)

    drive((80, 24), scenario)


@pytest.mark.parametrize("tab", ["pairs", "train", "generate", "tune", "adapters", "jobs"])
def test_help_model_cancel_and_quit_stay_in_the_key_bar_at_120_columns(tab: str) -> None:
    def pinned_keys(app: SterApp) -> set[str]:
        """The keys pinned right, when their group is laid out inside the screen (the bar is rebuilt as the
        focus moves, so a test waits for a laid-out one)."""
        for group in app.screen.query("#pinned"):
            if group.region.width and Region(0, 0, *app.size).contains_region(group.region):
                return {key.key for key in group.children}
        return set()

    async def scenario(app: SterApp, pilot: Pilot) -> None:
        await app.action_show_tab(tab)
        await until(
            pilot, lambda: {"question_mark", "m", "q"} <= pinned_keys(app) and bool(pinned_keys(app) & {"ctrl+x", "x"})
        )

    drive((120, 34), scenario)


def test_a_dialog_shows_its_own_keys_not_the_tabs() -> None:
    async def scenario(app: SterApp, pilot: Pilot) -> None:
        app.push_screen(Confirm("Replace it?", "Replace", "Keep it"))
        await until(pilot, lambda: any(bar.query("FooterKey") for bar in app.screen.query(KeyBar)))
        bar = app.screen.query_one(KeyBar)
        on_screen(app, bar)
        assert {key.description for key in bar.query("FooterKey")} == {"Yes", "No"}  # not Add, Edit, Delete…
        await pilot.press("n")
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        on_screen(app, app.screen.query_one("VerticalScroll"))  # the help fits an 80-column screen
        await pilot.press("escape")
        await pilot.press("m")
        await pilot.pause(0.2)
        for widget in app.screen.query("Select, Field, Button"):
            on_screen(app, widget)

    drive((80, 24), scenario)


def test_the_jobs_table_lists_newest_first_follows_the_running_job_and_never_freezes_widths(tmp_path: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot) -> None:
        jobs = app.query_one("#jobs-pane")
        app.start_job(
            "train", {"model": "ster:toy", "pairs": PAIRS, "layers": "9", "output": tmp_path / "x.json"}, jobs
        )
        await settle(pilot, app)
        fields = {
            "model": "ster:toy",
            "trait": "calm",
            "opposite": "alarmed",
            "count": 2,
            "retry_multiplier": 20000,
            "output": tmp_path / "never.json",
        }
        handle = app.start_job("pairs synthesize", fields, jobs)
        await until(pilot, lambda: handle is not None and handle.state == "running")
        await pilot.press("6")
        table = app.query_one("#job-table", DataTable)
        ids = [str(table.get_row_at(row)[0]) for row in range(table.row_count)]
        assert ids == sorted(ids, key=int, reverse=True) and ids[0] == str(handle.id)
        assert table.cursor_row == 0  # on the running job, so x cancels it
        await pilot.press("x")
        await settle(pilot, app)
        states = {str(table.get_row_at(row)[0]): str(table.get_row_at(row)[2]) for row in range(table.row_count)}
        assert states[str(handle.id)] == "cancelled" and "refused" in states.values()
        state_column = next(c for c in table.columns.values() if str(c.label) == "state")
        assert state_column.width >= len("cancelled")
        last = next(c for c in table.columns.values() if str(c.label) == "last message")
        assert last.width >= 80 - 50  # the message takes what the short columns leave

    drive((80, 24), scenario)
