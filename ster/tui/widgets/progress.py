"""A pane's progress line: which job, its stage and sentence, and a bar that only moves forward.

The line follows the pane's latest job from the queue to its end. Before the job's
first event it says what the wait is (another job running first, or the engine being
imported: the first job of a session spends seconds importing torch before it can say
anything). While the job runs it shows the stage, the engine's sentence, the fraction
of the whole job (:mod:`ster.tui.progress`) and the seconds so far. When the job ends
it says how: done at 100%, or cancelled and refused where they stopped. Idle, nothing
moves.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ster.tui.progress import Step
from ster.tui.runner import JobHandle
from ster.tui.words import in_our_words

LOOK = {
    "done": ("done", "green"),
    "refused": ("refused", "red"),
    "cancelled": ("cancelled", "magenta"),
    "failed": ("failed", "bold red"),
}


class JobProgress(Static):
    """One line: ``what · stage · sentence ··· bar percent seconds``."""

    DEFAULT_CSS = "JobProgress { height: 1; padding: 0 1; }"

    def __init__(self, idle: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.idle = idle
        self.handle: JobHandle | None = None
        self.what = ""
        self.step = Step("", "", 0.0)
        self.note = ""
        """Set when the job is not running: why it waits, or how it ended."""
        self.since = 0.0
        self.plain = idle
        self.state = "idle"
        """The followed job as this line last heard of it (the app updates the handle only after the pane)."""

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)
        self._draw()

    def queued(self, handle: JobHandle, what: str) -> None:
        """The pane asked for a job; it waits until the jobs before it are done."""
        if self.state != "running":
            self._follow(handle, what, "queued", "queued: waits for the running job to finish")

    def started(self, handle: JobHandle, what: str, first: Step) -> None:
        """The job runs; ``first`` says what it does before its first event (see :func:`first_step`)."""
        self._follow(handle, what, "running", "")
        self.step, self.since = first, self._now()
        self._draw()

    def stepped(self, handle: JobHandle, step: Step) -> None:
        if handle is self.handle:
            self.step = step
            self._draw()

    def ended(self, handle: JobHandle, state: str, sentence: str = "") -> None:
        """The job's end: ``state`` is the handle's final state; a refusal's sentence is shown elsewhere."""
        if handle is not self.handle:
            return
        self.state = state
        word, _ = LOOK[state]
        self.note = word if state != "cancelled" else f"{word} at {self.step.fraction:.0%}: {in_our_words(sentence)}"
        if state == "done":
            self.step = Step("", "", 1.0)
        self._draw()

    def _follow(self, handle: JobHandle, what: str, state: str, note: str) -> None:
        self.handle, self.what, self.state, self.note, self.step = handle, what, state, note, Step("", "", 0.0)
        self._draw()

    def _tick(self) -> None:
        if self.state == "running":
            self._draw()

    def _draw(self) -> None:
        if self.handle is None:
            self.plain = self.idle
            self.update(Text(self.idle, style="dim"))
            return
        words = self._words()
        shows_bar = self.state not in ("queued", "refused", "failed")
        self.plain = f"{words.plain} {self.step.fraction:.0%}" if shows_bar else words.plain
        """The line as plain text (the bar as its percentage), for tests."""
        grid = Table.grid(expand=True, padding=(0, 1))
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(no_wrap=True, justify="right")
        grid.add_row(words, self._bar() if shows_bar else Text(""))
        self.update(grid)

    def _words(self) -> Text:
        text = Text(self.what, style="bold")
        if self.state in LOOK:
            return text.append(f" · {self.note}", style=LOOK[self.state][1])
        if self.note:
            return text.append(f" · {self.note}", style="dim")
        if self.step.stage and not self.step.message.startswith(self.step.stage):
            text.append(f" · {self.step.stage}", style="cyan")
        return text.append(f" · {self.step.message}")

    def _bar(self) -> Table:
        width = max(8, min(24, self.size.width // 4))
        cells = Table.grid(padding=(0, 1))
        style = "bar.complete" if self.state != "cancelled" else "magenta"
        cells.add_row(
            ProgressBar(
                total=1.0, completed=self.step.fraction, width=width, complete_style=style, finished_style="green"
            ),
            Text(f"{self.step.fraction:4.0%}"),
            Text(self._seconds(), style="dim"),
        )
        return cells

    def _now(self) -> float:
        """The app's clock (a snapshot test's app stops it, so the seconds are the same every run)."""
        return getattr(self.app, "clock", time.monotonic)()

    def _seconds(self) -> str:
        if self.state != "running":
            return ""
        return f"{self._now() - self.since:3.0f}s"
