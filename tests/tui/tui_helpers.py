"""Driving the app in tests: start it on a settings object, wait for its jobs."""

from __future__ import annotations

from textual.pilot import Pilot

from ster.tui.app import SterApp


async def settle(pilot: Pilot, app: SterApp, seconds: float = 60.0) -> None:
    """Wait until no job is queued or running (bounded), then let the UI catch up."""
    for _ in range(int(seconds / 0.05)):
        await pilot.pause(0.05)
        if not app.runner.active():
            break
    await pilot.pause(0.1)


async def until(pilot: Pilot, condition, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("the condition never held")


def screen_text(app: SterApp) -> str:
    """What the terminal shows, as plain text (from the app's SVG screenshot)."""
    import html
    import re

    svg = app.export_screenshot()
    lines = re.findall(r"<text[^>]*>(.*?)</text>", svg)
    return html.unescape(" ".join(lines)).replace("\xa0", " ")
