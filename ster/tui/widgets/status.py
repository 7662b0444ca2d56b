"""The status line under the tabs: what the app works on (left) and what it is doing (right).

The right part — the running job, its stage and how far it has come, or ``idle`` — is
sized first and never cut; the left part (model, artifact, the adapter once there is one,
pair set, how the model is loaded, and the server that loads it when jobs run on one) takes
the rest and ends in an ellipsis when the screen is narrow.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ster.tui.runner import JobHandle
from ster.tui.settings import Settings


class StatusLine(Static):
    """One line that says what the app is working on and what it is doing."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $text-muted;
        padding: 0 1;
    }
    """

    def show(self, settings: Settings, running: JobHandle | None, server: str | None = None) -> None:
        """``server`` is the URL of the server jobs run on; None when they run in this process."""
        chat = settings.chat_template if settings.chat_decision is None else settings.chat_decision
        where = Text(no_wrap=True, overflow="ellipsis")
        loaded = f"{settings.precision} {settings.device}"
        if server:
            loaded += f" on {urlsplit(server).netloc or server}"
        adapter = [("adapter", settings.adapter_label())] if settings.adapter is not None else []
        for label, value in (
            ("model", settings.model),
            ("artifact", settings.artifact_label()),
            *adapter,
            ("pairs", settings.pairs.name if settings.pairs else "none"),
            ("", loaded),
            ("chat", chat),
        ):
            where.append(f"{label} " if label else "", style="dim")
            where.append(f"{value}  ", style="bold")
        grid = Table.grid(expand=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(no_wrap=True, justify="right", max_width=max(24, self.size.width * 2 // 5))
        job = job_words(running)
        grid.add_row(where, job)
        self.plain = f"{where.plain.rstrip()} | {job.plain}"
        """The line as plain text, for tests and screen readers of the log."""
        self.update(grid)


def job_words(handle: JobHandle | None) -> Text:
    """``optimize 45% reading pair 3/12``, ``train queued``, or ``idle``."""
    if handle is None:
        return Text("idle", style="dim")
    text = Text(handle.name, style="bold yellow")
    if handle.state != "running":
        return text.append(f" {handle.state}", style="dim")
    step = handle.step
    if step is not None:
        text.append(f" {step.fraction:.0%}", style="bold")
        text.append(f" {step.stage or step.message}")
    return text
