"""The app on SmolLM2-135M-Instruct, as a new user meets it: train, then generate at the default
strength, which is relative to the layer's activation norm and must move a real model's text."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.steering.strength import DEFAULT_STRENGTH
from ster.tui.app import SterApp
from ster.tui.settings import Settings
from ster.tui.widgets.generate import GeneratePane
from ster.tui.widgets.status import StatusLine
from tests.tui.tui_helpers import settle

pytestmark = pytest.mark.real


def test_the_default_strength_moves_smollm2s_text_and_the_panels_say_what_was_applied(smol: Path) -> None:
    async def scenario() -> None:
        app = SterApp(Settings(model=str(smol), pairs=EXAMPLES_DIR / "pairs.json", trait="calm"))
        async with app.run_test(size=(120, 34)) as pilot:
            await settle(pilot, app)
            await pilot.press("2")
            app.query_one("#layers").value = "12"
            await pilot.press("escape", "t")
            await settle(pilot, app, 300)
            await pilot.press("3")
            pane = app.query_one(GeneratePane)
            pane.query_one("#max-new-tokens").value = "16"
            await pilot.press("escape", "g")
            await settle(pilot, app, 300)
            steered, baseline = pane.panel("steered"), pane.panel("baseline")
            assert pane.query_one("#strength").value == DEFAULT_STRENGTH
            assert steered.text and baseline.text and steered.text != baseline.text
            applied = "calm.caa.smollm2-135m-instruct (caa, layer 12)"
            assert steered.title == f"steered {DEFAULT_STRENGTH} · {applied}"
            # at 120 columns the panel's border has room for the strength and the artifact's name; the
            # status line names it whole, method and layer included
            assert steered.border_title == f"steered {DEFAULT_STRENGTH} · calm.caa.smollm2-135m-instruct"
            assert f"artifact {applied}" in app.query_one(StatusLine).plain
            assert [h.request.strength for h in app.runner.handles if h.name == "generate"][1] is None

    asyncio.run(scenario())
