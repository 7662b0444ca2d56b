"""Fixtures the TUI tests share."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ster.engine.protocol.jobs import JobContext

STEP_PAUSE = 0.02
"""Seconds each training step's progress event waits: enough for a test to press ctrl+x while the run is
still going on a fast CPU (the toy's 240 steps otherwise end within the app's next few redraws)."""


@pytest.fixture
def paced_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training steps that take at least ``STEP_PAUSE`` each, so a cancel lands mid-run. Only the pace changes:
    the numbers a run computes are the same."""
    progress = JobContext.progress

    def paced(
        self: JobContext,
        stage: str,
        message: str,
        current: int | None = None,
        total: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        progress(self, stage, message, current, total, data)
        if stage == "train" and current is not None:
            time.sleep(STEP_PAUSE)

    monkeypatch.setattr(JobContext, "progress", paced)
