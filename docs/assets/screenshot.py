"""Regenerate docs/assets/ster.svg: the app on the bundled toy at 120x34, headless, through Textual's pilot.

The Train tab optimizes a direction on the example pairs (``o``), then the Generate tab generates one prompt
steered and unsteered at the default strength (``g``) and sweeps six toy prompts whose unsteered answers are
alarmed (``w``). Run from the repository root: ``python docs/assets/screenshot.py``. The artifact goes to a
temporary data directory, so nothing outside it is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "assets" / "ster.svg"
ALARMED = [
    "question : tell me about the town . answer :",
    "question : tell me about the forest . answer :",
    "question : how is the market today ? answer :",
    "question : tell me about the bridge . answer :",
    "question : tell me about the hill . answer :",
    "question : tell me about the park . answer :",
]


async def shoot(work: Path) -> str:
    from ster.engine.model.resolve import EXAMPLES_DIR
    from ster.tui.app import SterApp
    from ster.tui.settings import Settings

    prompts = work / "alarmed.json"
    prompts.write_text(json.dumps({"prompts": ALARMED}))
    app = SterApp(Settings(model="ster:toy", pairs=EXAMPLES_DIR / "pairs.json", trait="calm"))
    async with app.run_test(size=(120, 34)) as pilot:

        async def settle(seconds: float = 120.0) -> None:
            for _ in range(int(seconds / 0.05)):
                await pilot.pause(0.05)
                if not app.runner.active():
                    break
            await pilot.pause(0.3)

        await settle()
        await pilot.press("2")
        await pilot.pause(0.3)
        await pilot.press("escape", "o")
        await settle()
        await pilot.press("3")
        await pilot.pause(0.3)
        app.query_one("#strengths").value = "-0.8x,-0.4x,0.4x,0.8x"  # type: ignore[attr-defined]
        app.query_one("#prompts").value = str(prompts.name)  # type: ignore[attr-defined]
        await pilot.press("escape", "g")
        await settle()
        await pilot.press("escape", "w")
        await settle()
        return app.export_screenshot(title="ster")


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        os.environ["XDG_DATA_HOME"] = str(Path(work) / "data")
        os.chdir(work)
        svg = asyncio.run(shoot(Path(work)))
    OUT.write_text(svg)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(svg)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
