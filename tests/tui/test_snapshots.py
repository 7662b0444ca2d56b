"""Snapshot tests: each pane in a deterministic state at 130x36, stored under snapshots/ at the repository root.

Model numbers are not bitwise stable across CPUs, so the panes here are driven by canned
engine events delivered through the same messages a job's worker posts; Pilot tests on
the real engine check the numbers. Update with ``pytest tests/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot

from ster.engine.protocol.events import Log, Progress, Result
from ster.engine.steering.requests import OptimizeRequest
from ster.engine.model.resolve import EXAMPLES_DIR as EXAMPLES
from ster.tui.app import SterApp
from ster.tui.messages import JobEvent, JobFinished, JobStarted
from ster.tui.runner import JobHandle
from ster.tui.settings import Settings

SIZE = (130, 36)
CANDIDATES = [
    {"layer": layer, "method": method, "holdout_accuracy": acc, "holdout_margin": margin, "selected": selected}
    for layer, method, acc, margin, selected in [
        (0, "caa", 1.0, 0.2545, False), (0, "pca", 0.6667, 0.1846, False), (0, "logistic", 1.0, 0.2307, False),
        (1, "caa", 1.0, 0.3260, False), (1, "pca", 0.6667, 0.2261, False), (1, "logistic", 1.0, 0.2832, False),
        (2, "caa", 1.0, 0.3352, False), (2, "pca", 0.6667, 0.2033, False), (2, "logistic", 1.0, 0.3076, False),
        (3, "caa", 1.0, 0.3894, True), (3, "pca", 1.0, 0.2525, False), (3, "logistic", 1.0, 0.3696, False),
    ]
]
OPTIMIZED = {
    "schema_version": 1, "product": "ster", "model": "ster:toy", "model_revision": None, "trait_name": "calm",
    "method": "caa", "hidden_size": 64, "precision": "f32", "chat_template": "absent",
    "metadata": {"selection": "chosen over 12 candidates on a 3-pair holdout, then refitted on all 12 pairs"},
    "layers": [{"layer": 3, "width": 64, "norm": 1.0, "train_accuracy": 1.0, "train_margin": 0.422,
                "activation_norm": 10.3}],
    "selection": {"holdout": {"fit_pairs": 9, "holdout_pairs": 3}, "candidates": CANDIDATES},
}


def canned_optimize(app: SterApp) -> JobHandle:
    """Deliver an optimize job's life to the Train pane, as its worker would."""
    pane = app.query_one("#train-pane")
    request = OptimizeRequest(model="ster:toy", output=Path("calm.ster.json"))
    handle = JobHandle(1, "optimize", request, pane)
    app.runner.handles.append(handle)
    pane.post_message(JobStarted(handle))
    for event in [Progress(stage="resolve", message="resolving model ster:toy"),
                  Log(message="this model publishes no chat template, so prompts and completions are encoded as "
                              "raw text"),
                  Log(message="fitting each candidate on 9 pairs and ranking on a 3-pair holdout"),
                  Progress(stage="read", message="reading pair 12/12", current=12, total=12)]:
        pane.post_message(JobEvent(handle, event))
    pane.post_message(JobFinished(handle, Result(command="optimize", data=OPTIMIZED)))
    return handle


def test_train_pane_after_optimize(snap_compare) -> None:
    """You should see the Train tab: the candidate table with layer 3 caa highlighted and ticked,
    the per-layer plot with layer 3 marked, and the 'wrote calm.ster.json' line in green."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.press("2")
        canned_optimize(pilot.app)  # type: ignore[arg-type]
        await pilot.pause(0.2)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(SterApp(Settings()), terminal_size=SIZE, run_before=run_before)


def test_jobs_pane_with_a_finished_job(snap_compare) -> None:
    """You should see the Jobs tab: one optimize job, done, and its events in the log below."""

    async def run_before(pilot: Pilot) -> None:
        canned_optimize(pilot.app)  # type: ignore[arg-type]
        await pilot.pause(0.2)
        await pilot.press("4")
        await pilot.pause(0.2)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(SterApp(Settings()), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare) -> None:
    """You should see the help screen over the app: the keys that work everywhere, then per tab."""
    assert snap_compare(SterApp(Settings()), terminal_size=SIZE, press=["question_mark"])


async def finish_jobs(pilot: Pilot) -> None:
    for _ in range(600):
        await pilot.pause(0.05)
        if not pilot.app.runner.active():  # type: ignore[attr-defined]
            break
    await pilot.pause(0.2)
    await pilot.wait_for_scheduled_animations()


def test_pairs_pane_with_the_example_set(snap_compare, monkeypatch) -> None:
    """You should see the Pairs tab: the toy's 12 calm/alarmed pairs, no flags, the set summary above,
    and the first pair in full below (the inspection is pure text, so this runs the real job)."""
    monkeypatch.chdir(EXAMPLES)  # the pane shows the path: keep it the same wherever the checkout is
    settings = Settings(pairs=Path("pairs.json"))

    async def run_before(pilot: Pilot) -> None:
        await finish_jobs(pilot)

    assert snap_compare(SterApp(settings), terminal_size=SIZE, run_before=run_before)


def test_generate_pane_side_by_side(snap_compare, tmp_path: Path) -> None:
    """You should see the Generate tab: unsteered 'the town is flooding and we flee.' beside steered
    'the town is gentle and we rest.' at strength 3 (the toy is deterministic by construction)."""
    from ster.cli import main

    vector = tmp_path / "calm.json"
    assert main(["optimize", "--model", "ster:toy", "--pairs", str(EXAMPLES / "pairs.json"), "--output",
                 str(vector)]) == 0

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("3")
        await pilot.pause()
        await pilot.press("g")
        await finish_jobs(pilot)

    assert snap_compare(SterApp(Settings(vector=vector)), terminal_size=SIZE, run_before=run_before)
