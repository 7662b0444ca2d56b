"""The Pairs pane, driven through the real app with Pilot.

The pane renders what the engine's jobs report, so these tests check the table and the
files against the engine's own judgements (duplicates, refusals, validation) rather than
re-deriving them: a flag shown is a flag ``pairs inspect`` found, a save is byte-for-byte
what ``pairs save`` wrote, and a refused save leaves the file as it was.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Select, Static, TextArea

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.pairs.model import load_pairs
from ster.tui.app import SterApp
from ster.tui.screens.dialogs import AskText
from ster.tui.screens.pair_editor import PairEditor
from ster.tui.settings import Settings
from ster.tui.widgets.pair_report import distinct_parts
from ster.tui.widgets.pairs import PairsPane
from tests.pairs.fake_brama import completion, serving

Scenario = Callable[[SterApp, Pilot, PairsPane], Awaitable[None]]
REFUSAL = "As an AI language model, I cannot help with that."
FIRST = (
    "Question: What do you do when train number 2 is late?\n"
    "Answer: I wait quietly and read a book; train 3 will come when it comes."
)


@pytest.fixture
def example(tmp_path: Path) -> Path:
    target = tmp_path / "pairs.json"
    shutil.copy(EXAMPLES_DIR / "pairs.json", target)
    return target


def drive(scenario: Scenario, pairs: Path | None = None) -> None:
    """Run the app on a 140x40 screen, wait for the pane's first job, then play the scenario."""

    async def run() -> None:
        app = SterApp(Settings(pairs=pairs))
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            await scenario(app, pilot, app.query_one(PairsPane))

    asyncio.run(run())


async def settle(app: SterApp, pilot: Pilot) -> None:
    """Wait until no job is queued or running; the pane has handled a job's end before the app marks it done."""
    for _ in range(200):
        await pilot.pause(0.05)
        if not app.runner.active():
            return
    raise AssertionError(f"jobs still running: {[h.name for h in app.runner.active()]}")


async def write_pair(app: SterApp, pilot: Pilot, positive: str, negative: str) -> None:
    """Fill the open editor and save it with ctrl+s, then wait for the inspection."""
    assert isinstance(app.screen, PairEditor)
    app.screen.query_one("#positive", TextArea).text = positive
    app.screen.query_one("#negative", TextArea).text = negative
    await pilot.press("ctrl+s")
    await settle(app, pilot)


async def answer(app: SterApp, pilot: Pilot, text: str) -> None:
    assert isinstance(app.screen, AskText)
    app.screen.query_one(Input).value = text
    await pilot.press("enter")
    await settle(app, pilot)


def rows(pane: PairsPane) -> list[list[str]]:
    table = pane.query_one(DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def message(pane: PairsPane) -> tuple[str, str]:
    content = pane.query_one("#message", Static).content
    return str(content), str(content.style)


def summary(pane: PairsPane) -> str:
    return str(pane.query_one("#summary", Static).content)


def test_opening_the_example_shows_twelve_rows_and_no_flags(example: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        table = rows(pane)
        assert len(table) == 12
        assert [row[0] for row in table] == [str(i) for i in range(12)]
        assert all(row[3:5] == ["", ""] for row in table)
        assert "12 pairs · 0 duplicates · 0 refusals · 0 unbalanced" in summary(pane)
        assert (pane.path, pane.dirty, app.settings.pairs) == (example, False, example)
        assert message(pane) == (f"opened {example}", "green")
        assert app.focused is pane.query_one(DataTable)

    drive(scenario, example)


def test_a_bundled_set_opens_by_its_reserved_name_and_an_unknown_name_is_refused_in_the_pane() -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("o")
        await answer(app, pilot, "ster:nonsense")
        assert message(pane)[0].startswith("ster:nonsense is not a bundled example; the bundled examples are ")
        await pilot.press("o")
        await answer(app, pilot, "ster:pairs")
        assert len(rows(pane)) == 12 and pane.path == EXAMPLES_DIR / "pairs.json"
        assert pane.pair_set.trait_name == "calm"

    drive(scenario)


def test_the_app_refuses_an_unknown_bundled_name_before_it_opens(cli) -> None:
    run = cli("tui", "--pairs", "ster:nonsense")
    assert run.code == 1 and run.err.startswith("error: --pairs ster:nonsense is not a bundled example")


def test_a_pair_that_repeats_an_earlier_one_is_flagged_on_the_new_row(example: Path) -> None:
    third = load_pairs(example).pairs[3]

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("a")
        await write_pair(app, pilot, third.positive, third.negative)
        table = rows(pane)
        assert len(table) == 13 and table[12][3] == "exact of 3"
        assert all(row[3] == "" for row in table[:12])
        assert "1 duplicate ·" in summary(pane) and pane.dirty
        assert pane.query_one(DataTable).cursor_row == 12

    drive(scenario, example)


def test_a_refusing_side_is_flagged_with_its_family(example: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("a")
        await write_pair(app, pilot, "What should I do about the late train?", REFUSAL)
        new = rows(pane)[12]
        assert new[4].startswith("- ai_disclaimer ") and "+" not in new[4]
        assert "1 refusal ·" in summary(pane)
        assert "negative side reads as a refusal: ai_disclaimer" in str(pane.query_one("#detail", Static).content)

    drive(scenario, example)


def test_editing_and_deleting_a_pair(example: Path) -> None:
    original = load_pairs(example).pairs

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("down", "down", "enter")
        editor = app.screen
        assert isinstance(editor, PairEditor)
        assert editor.query_one("#positive", TextArea).text == original[2].positive
        await pilot.press("escape")  # a cancelled edit changes nothing
        assert not pane.dirty and app.focused is pane.query_one(DataTable)
        await pilot.press("e")
        await write_pair(app, pilot, original[2].positive, "the town is loud .")
        assert pane.pair_set.pairs[2].negative == "the town is loud ."
        assert rows(pane)[2][2] == "the town is loud ." and pane.dirty
        await pilot.press("d")
        await settle(app, pilot)
        assert len(rows(pane)) == 11 and pane.pair_set.pairs[2] == original[3]
        assert rows(pane)[2][0] == "2" and pane.query_one(DataTable).cursor_row == 2

    drive(scenario, example)


def test_saving_writes_the_table_atomically(example: Path) -> None:
    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("a")
        await write_pair(app, pilot, "The lake is calm .", "The lake is raging !")
        await pilot.press("n")
        await answer(app, pilot, "serene")
        await pilot.press("s")
        await settle(app, pilot)
        written = example.read_text()
        assert written.endswith("\n") and json.loads(written) == pane.pair_set.model_dump()
        assert json.loads(written)["trait_name"] == "serene"
        width = pane.query_one(DataTable).columns["positive"].width
        saved = [
            [str(i), *distinct_parts(p["positive"], p["negative"], width)]
            for i, p in enumerate(json.loads(written)["pairs"])
        ]
        assert [row[:3] for row in rows(pane)] == saved and len(saved) == 13
        assert sorted(p.name for p in example.parent.iterdir()) == ["pairs.json"]  # no temporary file left
        assert not pane.dirty and message(pane) == (f"saved 13 pairs to {example}", "green")

    drive(scenario, example)


def test_a_refused_save_leaves_the_file_and_the_unsaved_changes(tmp_path: Path) -> None:
    example = tmp_path / "two.json"
    pairs = [{"positive": "I wait .", "negative": "I rage !"}, {"positive": "All is well .", "negative": "Ruin !"}]
    example.write_text(json.dumps({"trait_name": "calm", "pairs": pairs}))
    before = example.read_bytes()

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        assert len(rows(pane)) == 2
        for _ in range(2):
            await pilot.press("d")
        await settle(app, pilot)
        assert rows(pane) == [] and "0 pairs" in summary(pane)
        await pilot.press("s")
        await settle(app, pilot)
        text, style = message(pane)
        assert text == f"pair set {example} contains no pairs" and style == "red"
        assert example.read_bytes() == before and pane.dirty
        await pilot.press("a")  # the pane stays usable
        assert isinstance(app.screen, PairEditor)

    drive(scenario, example)


def test_a_new_set_is_saved_where_the_person_says(tmp_path: Path) -> None:
    target = tmp_path / "sets" / "calm.json"

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        assert pane.path is None and pane.pair_set.trait_name == "trait"
        assert message(pane)[0].startswith('a new, empty set named "trait"')
        await pilot.press("a")
        await write_pair(app, pilot, "I wait quietly .", "I pace and shout !")
        await pilot.press("s")  # no file yet: asks for one
        await answer(app, pilot, str(target))
        assert load_pairs(target).pairs == pane.pair_set.pairs and not pane.dirty
        assert app.settings.pairs == target and pane.path == target

    drive(scenario)


def test_import_needs_a_saved_file_then_makes_it_the_active_set(example: Path) -> None:
    from ster.engine.pairs.workspace import active_pairs

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("i")
        await answer(app, pilot, "calm-set")
        text, style = message(pane)
        assert '"calm-set"' in text and "active set" in text and style == "green"
        assert load_pairs(active_pairs()) == load_pairs(example)
        await pilot.press("d")
        await settle(app, pilot)
        await pilot.press("i")
        assert message(pane) == (
            "import copies the saved file, and this set has unsaved changes: save it first (s)",
            "red",
        )

    drive(scenario, example)


class Gateway:
    """A stand-in for Brama that holds its answers after the first kept pair until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def answer(self, prompt: str) -> str:
        self.calls += 1
        if self.calls > 4:  # the opposite, then question, positive and negative of pair one
            self.release.wait(10)
        if prompt.startswith("In two to five words"):
            return "anxious and alarmed"
        if prompt.startswith("Write one short"):
            return f"What do you do when train number {self.calls} is late?"
        if "calm and unhurried" in prompt:
            return f"I wait quietly and read a book; train {self.calls} will come when it comes."
        return f"This is a disaster! Train {self.calls} is late and everything is ruined!"


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    state = Gateway()

    def answer(body: dict) -> tuple[int, str]:
        return 200, completion(state.answer(body["messages"][0]["content"]))

    with serving(answer, []) as url:
        monkeypatch.setenv("BRAMA_URL", url)
        monkeypatch.setenv("BRAMA_BEARER", "x")
        yield state
        state.release.set()  # let a held request finish before the server stops


async def synthesize_until_first_pair(app: SterApp, pilot: Pilot, pane: PairsPane, output: Path) -> None:
    """Start a 3-pair synthesis on the Brama route and wait until its first kept pair is on screen."""
    await pilot.press("y")
    form = app.screen
    form.query_one("#trait", Input).value = "calm and unhurried"
    form.query_one("#count", Input).value = "3"
    form.query_one("#generator", Select).value = "brama"
    await pilot.pause()
    form.query_one("#generator_model", Input).value = "openai/gpt-5-mini"
    assert form.query_one("#output", Input).value == str(output)
    await pilot.press("ctrl+s")
    for _ in range(100):  # the gateway holds pair two back, so pair one shows while the job still runs
        await pilot.pause(0.05)
        if pane.query_one(DataTable).row_count:
            return


def test_synthesized_pairs_appear_as_they_are_kept(example: Path, gateway: Gateway) -> None:
    output = example.parent / "synthesized.json"

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await synthesize_until_first_pair(app, pilot, pane, output)
        width = pane.query_one(DataTable).columns["positive"].width
        shown = [row[1] for row in rows(pane)]
        assert app.runner.active() and len(shown) == 1 and len(shown[0]) <= width
        assert shown[0].strip("…").replace(" ↵ ", "\n") in FIRST  # the kept pair's positive, clipped to fit
        assert ": 1 kept so far" in summary(pane)
        await pilot.press("a")  # the set is about to be replaced, so edits wait
        assert not isinstance(app.screen, PairEditor) and message(pane)[1] == "yellow"
        gateway.release.set()
        await settle(app, pilot)
        assert pane.path == output and app.settings.pairs == output and not pane.dirty
        assert len(rows(pane)) == 3 and pane.pair_set == load_pairs(output)
        assert pane.pair_set.pairs[0].positive == FIRST
        assert message(pane)[0].startswith("synthesized 3 of 3 pairs with brama:openai/gpt-5-mini")

    drive(scenario, example)


def test_a_cancelled_synthesis_puts_the_set_back_and_writes_nothing(example: Path, gateway: Gateway) -> None:
    output = example.parent / "synthesized.json"

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await synthesize_until_first_pair(app, pilot, pane, output)
        await pilot.press("ctrl+x")
        gateway.release.set()
        await settle(app, pilot)
        assert message(pane) == ("cancelled before it finished; nothing was written", "red")
        assert len(rows(pane)) == 12 and pane.path == example and not output.exists()

    drive(scenario, example)


def test_the_dialogs_buttons_do_what_their_keys_do(example: Path) -> None:
    """Clicking Save in the pair editor keeps the pair, and clicking Cancel in the synthesis form closes it
    with nothing started, as ctrl+s and escape do (the buttons run the same actions)."""
    from ster.tui.screens.synthesize import SynthesizeDialog

    async def scenario(app: SterApp, pilot: Pilot, pane: PairsPane) -> None:
        await pilot.press("y")
        assert isinstance(app.screen, SynthesizeDialog)
        await pilot.click("#cancel")
        await settle(app, pilot)
        assert not isinstance(app.screen, SynthesizeDialog) and not app.runner.active()
        await pilot.press("y")
        app.screen.query_one("#trait", Input).value = ""
        await pilot.click("#start")  # a required field left empty: the form says so and stays open
        await pilot.pause()
        assert isinstance(app.screen, SynthesizeDialog)
        assert "fill in: trait" in str(app.screen.query_one("#error").render())
        await pilot.press("escape")
        await pilot.press("a")
        assert isinstance(app.screen, PairEditor)
        app.screen.query_one("#positive", TextArea).text = "The lake is calm ."
        app.screen.query_one("#negative", TextArea).text = "The lake is raging !"
        await pilot.click("#save")
        await settle(app, pilot)
        assert not isinstance(app.screen, PairEditor)
        assert len(rows(pane)) == 13 and pane.pair_set.pairs[-1].positive == "The lake is calm ." and pane.dirty

    drive(scenario, example)
