"""Snapshot tests: each tab in a deterministic state, at 80×24 (the smallest size the app is built
for) and at 130×36, stored under snapshots/ at the repository root.

Model numbers are not bitwise stable across CPUs, so the panes that show them are driven by
canned engine events delivered through the same messages a job's worker posts; Pilot tests on
the real engine check the numbers. The toy's generated text is stable by construction, so the
side-by-side texts come from the real engine. Update with
``pytest tests/tui/test_snapshots.py --snapshot-update``, and look at the SVGs before committing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from ster.engine.model.resolve import EXAMPLES_DIR as EXAMPLES
from ster.engine.protocol.events import Error, Log, Progress, Result, parse_event
from ster.engine.protocol.jobs import build_job_request
from ster.engine.steering.requests import OptimizeRequest
from ster.tui.app import SterApp
from ster.tui.messages import JobEvent, JobFinished, JobStarted
from ster.tui.progress import Step, Track
from ster.tui.runner import JobHandle
from ster.tui.settings import Settings
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.progress import JobProgress

SMALL, LARGE = (80, 24), (130, 36)
CANDIDATES = [
    {
        "layer": layer,
        "method": method,
        "holdout_accuracy": acc,
        "holdout_margin": margin,
        "holdout_separation": separation,
        "relative_margin": relative,
        "selected": selected,
    }
    for layer, method, acc, margin, separation, relative, selected in [
        (0, "caa", 1.0, 0.2545, 1.1976, 0.0954, False),
        (0, "pca", 0.6667, 0.1846, 1.2091, 0.0692, False),
        (0, "logistic", 1.0, 0.2307, 1.4332, 0.0865, False),
        (1, "caa", 1.0, 0.3260, 1.5995, 0.0833, False),
        (1, "pca", 0.6667, 0.2261, 0.7954, 0.0578, False),
        (1, "logistic", 1.0, 0.2832, 2.0093, 0.0723, False),
        (2, "caa", 1.0, 0.3352, 1.3967, 0.0567, False),
        (2, "pca", 0.6667, 0.2033, 0.8931, 0.0344, False),
        (2, "logistic", 1.0, 0.3076, 2.4884, 0.0521, True),
        (3, "caa", 1.0, 0.3894, 1.6876, 0.0380, False),
        (3, "pca", 1.0, 0.2525, 1.1332, 0.0246, False),
        (3, "logistic", 1.0, 0.3696, 2.3517, 0.0360, False),
    ]
]
"""The toy's optimize over the example pairs (from ``ster optimize``), numbers rounded."""
OPTIMIZED = {
    "schema_version": 1,
    "product": "ster",
    "model": "ster:toy",
    "model_revision": None,
    "trait_name": "calm",
    "method": "logistic",
    "hidden_size": 64,
    "precision": "f32",
    "chat_template": "absent",
    "metadata": {"selection": "chosen over 12 candidates on a 3-pair holdout, then refitted on all 12 pairs"},
    "layers": [
        {"layer": 2, "width": 64, "norm": 1.0, "train_accuracy": 1.0, "train_margin": 0.3568, "activation_norm": 5.9239}
    ],
    "selection": {"holdout": {"fit_pairs": 9, "holdout_pairs": 3}, "candidates": CANDIDATES},
}
SWEPT: dict[str, Any] = json.loads((Path(__file__).parent / "canned_sweep.json").read_text())
"""A sweep of the toy's calm direction at -0.8x..0.8x over six prompts whose answers are alarmed (``ALARMED``),
numbers rounded (from ``ster sweep``)."""
ALARMED = {"prompts": [output["prompt"] for output in SWEPT["rows"][0]["outputs"]]}
TUNED: dict[str, Any] = json.loads((Path(__file__).parent / "canned_tune.json").read_text())
"""Every event of the toy's ``ster --json tune sft --examples ster:examples --epochs 4 --accumulation 2`` and
``tune dpo --pairs ster:pairs --epochs 3 --accumulation 2`` runs, numbers to six digits, tokens per second
fixed at 4000 and the adapter at the Tune tab's default path under /data, so nothing depends on the machine."""
CALIBRATED: dict[str, Any] = json.loads((Path(__file__).parent / "canned_calibrate.json").read_text())
"""The result of the toy's ``ster --json calibrate --model ster:toy --pairs ster:pairs --trials 12 --judge none``
(logistic at layer 2 chosen: +0.422x and -0.483x within a mean KL of 0.25), numbers to six digits."""
DURING = {"sft": 6, "dpo": 7}
"""The optimizer step a run "during" snapshot stops after (of 16 for sft, 18 for dpo)."""


class StillApp(SterApp):
    """The app with a clock that does not move, so the Jobs tab's durations are the same every run."""

    clock = staticmethod(lambda: 100.0)


@pytest.fixture(autouse=True)
def fixed_data_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Train tab names the default artifact under the data directory: keep that path the same."""
    monkeypatch.setenv("XDG_DATA_HOME", "/data")


def deliver(pane: Any, handle: JobHandle, events: list[Any], final: Any) -> None:
    """A job's life as its worker would post it: started, each event with its progress step, the end (none
    when ``final`` is None: the job is still running)."""
    track = Track(handle.name)
    pane.post_message(JobStarted(handle, Step("", "starting", 0.0)))
    for event in events:
        pane.post_message(JobEvent(handle, event, track.advance(event)))
    if final is not None:
        pane.post_message(JobFinished(handle, final))


def canned_optimize(app: SterApp) -> JobHandle:
    """Deliver an optimize job's life to the Train pane."""
    pane = app.query_one("#train-pane")
    handle = JobHandle(1, "optimize", OptimizeRequest(model="ster:toy", output=Path("calm.ster.json")), pane)
    app.runner.handles.append(handle)
    deliver(
        pane,
        handle,
        [
            Progress(stage="resolve", message="resolving model ster:toy"),
            Log(
                message="this model publishes no chat template, so prompts and completions are encoded as raw text",
                data={"chat_template": "absent"},
            ),
            Log(message="fitting each candidate on 9 pairs and ranking on a 3-pair holdout"),
            Progress(stage="read", message="reading pair 12/12", current=12, total=12),
        ],
        Result(command="optimize", data=OPTIMIZED),
    )
    return handle


def canned_calibrate(app: SterApp) -> JobHandle:
    """Deliver a calibrate job's life to the Train pane, writing the Train tab's default calibrated artifact."""
    pane = app.query_one("#train-pane")
    output = Path("/data/ster/artifacts/calm.calibrated.ster-toy.ster.json")
    handle = JobHandle(1, "calibrate", build_job_request("calibrate", model="ster:toy", output=output), pane)
    app.runner.handles.append(handle)
    deliver(
        pane,
        handle,
        [
            Progress(stage="resolve", message="resolving model ster:toy"),
            Progress(stage="read", message="reading pair 9/9", current=9, total=9),
            Progress(
                stage="calibrate", message="trial 12: pca at layers 1-2, 6 strengths in one batch", current=12, total=12
            ),
        ],
        Result(command="calibrate", data=CALIBRATED),
    )
    return handle


def canned_refusal(app: SterApp) -> None:
    """A train job refused for a layer the model does not have."""
    pane = app.query_one("#train-pane")
    request = build_job_request("train", model="ster:toy", layers="9", output=Path("never.json"))
    handle = JobHandle(2, "train", request, pane)
    app.runner.handles.append(handle)
    deliver(
        pane,
        handle,
        [Progress(stage="resolve", message="resolving model ster:toy")],
        Error(kind="refused", message="layer 9 is out of range: this model has 4 layers, numbered 0..3"),
    )


def canned_sweep(app: SterApp, vector: Path, prompts: Path) -> None:
    """Deliver a sweep's life to the Generate pane, as `w` would have started it on the prompt set ``prompts``."""
    pane = app.query_one("#generate-pane")
    strengths = "-0.8x,-0.4x,0.4x,0.8x"
    pane.query_one("#strengths").value, pane.query_one("#prompts").value = strengths, str(prompts)
    request = build_job_request("sweep", model="ster:toy", vector=vector, strengths=strengths, prompts=prompts)
    handle = JobHandle(9, "sweep", request, pane)
    app.runner.handles.append(handle)
    pane.jobs["sweep"], pane.sweep_source = handle, str(prompts)
    pane.query_one("#sweep").begin(list(request.strengths))
    deliver(
        pane,
        handle,
        [Progress(stage="sweep", message="strength +0.8x: prompt 6/6", current=30, total=30)],
        Result(command="sweep", data={**SWEPT, "vector": str(vector)}),
    )


def canned_tune(app: SterApp, objective: str, ended: bool) -> None:
    """Deliver a tune job's life to the Tune pane, as `t` would have started it from the form the canned run's
    fields are typed into: to its result when ``ended``, else up to its optimizer step ``DURING[objective]``
    (the job still running)."""
    pane: Any = app.query_one("#tune-pane")
    canned, job = TUNED[objective], f"tune {objective}"
    typed = {
        "data": "ster:examples" if objective == "sft" else "ster:pairs",
        "accumulation": "2",
        "epochs": "4" if objective == "sft" else "3",
    }
    for name, value in typed.items():
        pane.query_one(f"#{name}").value = value
    fields = pane.fields()
    assert fields["output"] == Path(canned["result"]["data"]["path"])  # the canned run wrote the default adapter
    handle = JobHandle(3, job, build_job_request(job, **fields), pane, fields)
    app.runner.handles.append(handle)
    pane.objectives[handle.id] = objective  # what the pane's own start (t) does next
    pane.query_one(JobProgress).queued(handle, job)
    pane.query_one(Curves).begin(objective)
    events = [parse_event(json.dumps(event)) for event in canned["events"]]
    if not ended:
        events = events[
            : next(
                at
                for at, event in enumerate(events)
                if event.type == "progress" and event.stage == "train" and event.current == DURING[objective]
            )
            + 1
        ]
    deliver(pane, handle, events, parse_event(json.dumps(canned["result"])) if ended else None)


async def settled(pilot: Pilot) -> None:
    """Wait for every job to end, then for the screen to stop changing (a loaded machine lags a refresh)."""
    for _ in range(600):
        await pilot.pause(0.05)
        if not pilot.app.runner.active():
            break
    await still(pilot)


async def still(pilot: Pilot) -> None:
    """Wait for the screen to stop changing."""
    for _ in range(5):
        await pilot.pause(0.1)
        await pilot.wait_for_scheduled_animations()


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "130x36"])
def test_train_pane_after_optimize(snap_compare, size: tuple[int, int]) -> None:
    """You should see the Train tab: the results title (12 candidates, logistic at layer 2 selected), the
    candidate table with its separation column beside the margin and layer 2 logistic (separation 2.488)
    in green and ticked, 'optimize · done' at 100%, and 'wrote calm.ster.json' in green; at 130 columns
    the plot of each layer's best candidate (accuracy and separation) beside the table, layer 2 marked."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("2")
        canned_optimize(pilot.app)
        await settled(pilot)

    assert snap_compare(StillApp(Settings(trait="calm")), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_train_pane_after_calibrate(snap_compare, size: tuple[int, int]) -> None:
    """You should see the Train tab after c: 'calibrate · done' at 100%, 'wrote …calm.calibrated.ster-toy…;
    Generate steers at its calibrated +0.422x' in green, the title 'calibrate: logistic at layer 2, chosen over
    12 trials within KL 0.25', and the front table (sign, layers, method, strength, KL, moved) with the + rows
    first by KL, '+0.422x' and '-0.483x' bold green and '✓ chosen', the cursor on the + one; at 120 columns
    the plot beside it: + cyan and − magenta against a log KL axis (0.001 … 10), the budget a yellow line at
    0.25 and the chosen points green ●."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("2")
        canned_calibrate(pilot.app)
        await settled(pilot)

    assert snap_compare(StillApp(Settings(trait="calm")), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "130x36"])
def test_jobs_pane_newest_first(snap_compare, size: tuple[int, int]) -> None:
    """You should see the Jobs tab: the refused train job (#2) above the optimize job (#1, done), each
    with its duration and last message, the cursor on #2, and their events in the log below."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.app.pane("train")
        canned_optimize(pilot.app)
        canned_refusal(pilot.app)
        await pilot.pause(0.2)
        await pilot.press("6")
        await settled(pilot)

    assert snap_compare(StillApp(Settings()), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "130x36"])
def test_help_screen(snap_compare, size: tuple[int, int]) -> None:
    """You should see the help screen inside the screen: what Ster does, what 0.4x and effect mean, then
    the keys that work everywhere; its own key bar says escape closes it."""
    assert snap_compare(SterApp(Settings()), terminal_size=size, press=["question_mark"])


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "130x36"])
def test_pairs_pane_with_the_example_set(snap_compare, monkeypatch, size: tuple[int, int]) -> None:
    """You should see the Pairs tab: the toy's 12 calm/alarmed pairs, no flags, the set summary above,
    and the first pair in full below (the inspection is pure text, so this runs the real job)."""
    monkeypatch.chdir(EXAMPLES)  # the pane shows the path: keep it the same wherever the checkout is

    async def run_before(pilot: Pilot) -> None:
        await settled(pilot)

    assert snap_compare(SterApp(Settings(pairs=Path("pairs.json"))), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "130x36"])
def test_generate_pane_side_by_side_and_a_sweep(
    snap_compare, tmp_path: Path, monkeypatch, size: tuple[int, int]
) -> None:
    """You should see the Generate tab ('mode add' at the right of the prompt row): steered 'the town is gentle
    and we rest.' (titled 'steered 0.4x · calm (logistic, layer 2)', at 80 columns 'steered 0.4x · calm') beside
    unsteered 'the town is flooding and we flee.', the prompts field naming alarmed.json, then the sweep of five strengths over its six prompts: +0.4x suggested
    (bold green, 'fluent ◀', effect '+0.467 ±0.25 ✓'), -0.8x marked ↺ (beyond its noise, against the push),
    -0.4x with no mark, +0.8x not fluent; and the caption saying what was swept, that +0.4x is suggested,
    and what effect, ± and the marks mean (residual-stream units, + toward calm)."""
    from ster.cli import main

    monkeypatch.chdir(tmp_path)
    assert (
        main(["optimize", "--model", "ster:toy", "--pairs", str(EXAMPLES / "pairs.json"), "--output", "calm.json"]) == 0
    )
    vector, prompts = Path("calm.json"), Path("alarmed.json")
    prompts.write_text(json.dumps(ALARMED))

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()  # the app shows the Pairs tab once mounted; switch after that
        await pilot.press("3")
        await pilot.pause()
        pilot.app.query_one("#strength").value = "0.4x"
        await pilot.press("g")
        await settled(pilot)
        canned_sweep(pilot.app, vector, prompts)
        await settled(pilot)

    assert snap_compare(SterApp(Settings(vector=vector)), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_generate_pane_ablating(snap_compare, tmp_path: Path, monkeypatch, size: tuple[int, int]) -> None:
    """You should see the Generate tab in ablate mode: 'mode ablate' at the right of the prompt row (the hill
    prompt), strength 1 and sweep 0.25,0.5,1 (the mode's defaults), the steered panel titled 'ablated (weight 1) ·
    calm' (at 120 columns with '(logistic, layer 2)') with 'the hill is calm and we rest.' beside unsteered 'the
    hill is burning and we flee.', its subtitle beginning 'embedding + blocks 0–3, layer 2's direction'; the
    sweep table's empty header names its first column 'weight' and its second 'no push'."""
    from ster.cli import main

    monkeypatch.chdir(tmp_path)
    assert (
        main(["optimize", "--model", "ster:toy", "--pairs", str(EXAMPLES / "pairs.json"), "--output", "calm.json"]) == 0
    )

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()  # the app shows the Pairs tab once mounted; switch after that
        await pilot.press("3")
        await pilot.pause()
        pilot.app.query_one("#prompt").value = "question : tell me about the hill . answer :"
        pilot.app.query_one("#mode").value = "ablate"
        await pilot.pause()
        await pilot.press("g")
        await settled(pilot)

    assert snap_compare(SterApp(Settings(vector=Path("calm.json"))), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("objective", ["sft", "grpo"])
@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_tune_pane_before_a_run(snap_compare, size: tuple[int, int], objective: str) -> None:
    """You should see the Tune tab before any run: objective, the data field (for sft 'a file, or
    ster:examples' in grey; for grpo the prompts), the adapter field with its default path in grey under
    /data/ster/artifacts ending .safetensors, epochs (iterations for grpo) 1, learning rate 0.0001,
    accumulation 8 (1 for grpo), rank 8, alpha 16, targets query,value; for grpo also reward 'length',
    group 4 and beta 0.04; the folded '▶ more settings' line; the idle progress line saying t trains,
    ctrl+x cancels, r resumes; and the curve area's hint. Every field is whole, nothing is cut at the right
    edge."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        pilot.app.query_one("#objective").value = objective
        await settled(pilot)

    assert snap_compare(StillApp(Settings(trait="calm")), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("objective", ["sft", "grpo"])
@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_tune_pane_more_settings_open(snap_compare, size: tuple[int, int], objective: str) -> None:
    """You should see the Tune tab's form as before a run, with '▼ more settings: seed 7' open under it:
    seed 7, layers all, warmup steps 0; checkpoint every 0, max sequence 512, and for sft batch 1; for grpo
    a third row, temperature 0.9, top-p 0.95, max new tokens 64 (and no batch). Below it the idle progress
    line and the curve area's hint, still on the screen at 80x24. Nothing is cut at the right edge."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        pilot.app.query_one("#objective").value = objective
        await pilot.pause()
        pane = pilot.app.query_one("#tune-pane")
        pane.query_one("#seed").value = "7"  # (Generate has a seed too)
        pane.query_one("#more").collapsed = False
        await settled(pilot)

    assert snap_compare(StillApp(Settings(trait="calm")), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("moment", ["during", "after"])
@pytest.mark.parametrize("objective", ["sft", "dpo"])
@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_tune_pane_running(snap_compare, size: tuple[int, int], objective: str, moment: str) -> None:
    """You should see the Tune tab with the run's fields (sft: examples ster:examples, epochs 4; dpo: pairs
    ster:pairs, epochs 3, beta 0.1; accumulation 2; the adapter's default path in grey), and: during a run, 'tune sft ·
    training · epoch 2/4 step 6/16 …' (dpo: 'epoch 2/3 step 7/18 …') with its bar and 0s, the loss curve
    (cyan) over steps 1..6 (dpo 1..7) beside the list of step 6/16 (7/18), epoch, loss, first loss, learn
    rate (and for dpo accuracy, in yellow: the second curve, drawn in yellow, and reward margin), tokens/s 4,000;
    for sft the learning rate is the yellow second curve. The bottom row names the axes: loss at the left, the
    second curve's name at the right, step between; no legend covers the plot's top corner. After the run:
    'tune sft · done' at 100%, the curve over every step (16, dpo 18), and in green 'sft done: 16 steps over
    4 epochs, loss 0.0032 → final 0.0032' (dpo: 18 steps over 3 epochs, loss 0.6931 → final 0.6911, accuracy
    1.000, reward margin 0.0032) and 'wrote the adapter /data/ster/artifacts/….safetensors and its .json
    sidecar'. Nothing is cut at the right edge."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        pilot.app.query_one("#objective").value = objective
        await pilot.pause()
        canned_tune(pilot.app, objective, ended=moment == "after")
        curves = pilot.app.query_one(Curves)
        steps = DURING[objective] if moment == "during" else TUNED[objective]["result"]["data"]["report"]["steps"]
        for _ in range(600):  # until the pane has taken every step delivered (and, after, the job has ended)
            await pilot.pause(0.05)
            if len(curves.points.get("loss", [])) == steps and (moment == "during" or not pilot.app.runner.active()):
                break
        curves.flush()  # draw every step now, not on the redraw timer
        await still(pilot)

    assert snap_compare(StillApp(Settings(trait="calm")), terminal_size=size, run_before=run_before)


ARTIFACTS = Path("/data/ster/artifacts")
EVALUATED = {
    role: {
        "model": "ster:toy",
        "model_revision": None,
        "adapter": adapter,
        "name": "toy-facts",
        "examples": 8,
        "evaluated": 8,
        "skipped_long": 0,
        "completion_tokens": 44,
        "loss": loss,
        "perplexity": perplexity,
        "mean_example_loss": mean,
        "mean_example_perplexity": mean_perplexity,
        "chat_template": "absent",
        "precision": "f32",
        "entries": [],
    }
    for role, adapter, loss, perplexity, mean, mean_perplexity in [
        ("base", None, 2.412577, 11.162191, 2.436021, 11.426985),
        ("adapter", str(ARTIFACTS / "examples.sft.ster-toy.safetensors"), 0.003138, 1.003143, 0.003152, 1.003157),
    ]
}
"""The toy's ``tune evaluate`` on ster:examples without and with an sft adapter, numbers rounded."""
INSPECTED = {
    "adapter": {
        "schema_version": 1,
        "product": "ster",
        "kind": "adapter",
        "model": "ster:toy",
        "model_revision": None,
        "model_fingerprint": None,
        "rank": 8,
        "alpha": 16.0,
        "scale": 2.0,
        "targets": ["query", "value"],
        "layers": [0, 1, 2, 3],
        "hidden_size": 64,
        "tensors": [
            {
                "name": f"layers.{layer}.{target}.{side}",
                "dtype": "F32",
                "shape": [8, 64] if side == "a" else [64 if target == "query" else 32, 8],
            }
            for layer in range(4)
            for target in ("query", "value")
            for side in "ab"
        ],
        "train": {
            "examples": 8,
            "epochs": 4,
            "steps": 16,
            "first_loss": 0.003244,
            "final_loss": 0.003164,
            "learning_rate": 0.0001,
            "accumulation": 2,
            "chat_template": "absent",
            "precision": "f32",
        },
    }
}
"""The toy's ``tune inspect`` of that adapter (from the canned sft run's report)."""


def canned_adapters(app: SterApp, shown: str) -> None:
    """Three rows in the session's adapters (a PEFT directory loaded, a cancelled dpo run's checkpoint, the sft
    run's adapter, the app's current one) and the detail ``shown`` (``evaluate`` or ``inspect``) of the last."""
    from ster.tui.adapters import AdapterEntry

    sft = ARTIFACTS / "examples.sft.ster-toy.safetensors"
    app.adapters.add(
        AdapterEntry(Path("/data/exports/calm.peft"), "peft", "peft", "ster:toy", "rank 8, no report", "loaded")
    )
    app.adapters.add(
        AdapterEntry(
            ARTIFACTS / "calm.dpo.ster-toy.safetensors.checkpoint",
            "checkpoint",
            "dpo",
            "ster:toy",
            "checkpoint, step 7/18",
            "cancelled",
        )
    )
    entry = app.adapters.add(
        AdapterEntry(
            sft,
            "adapter",
            "sft",
            "ster:toy",
            "loss 0.0032",
            "trained",
            INSPECTED["adapter"]["train"],
            INSPECTED,
            dict(EVALUATED),
        )
    )
    entry.evaluation["examples"] = "ster:examples"
    app.settings.use_adapter(sft, entry.info())
    pane: Any = app.query_one("#adapters-pane")
    pane.detail = (shown, sft)
    pane.book_changed(entry)


@pytest.mark.parametrize("shown", ["evaluate", "inspect"])
@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_adapters_pane_with_three_rows(snap_compare, size: tuple[int, int], shown: str) -> None:
    """You should see the Adapters tab: three rows, newest first — examples.sft.ster-toy (sft, ster:toy, 'loss
    0.0032', marked ● as the app's adapter, highlighted), the dpo run's checkpoint ('dpo ckpt', 'checkpoint, step
    7/18', in magenta), the PEFT directory calm.peft ('rank 8, no report') —, the 'evaluate on' field with
    ster:examples in grey, the idle line saying o loads, and in the detail area: for evaluate, 'evaluated on
    ster:examples (toy-facts): 8 of 8 examples, 44 completion tokens' over base model 2.4126 11.1622 2.4360
    11.4270 and, in green, with adapter 0.0031 1.0031 0.0032 1.0032; for inspect, the sidecar line (rank 8,
    alpha 16, scale 2, query, value on layers 0–3, hidden 64), the trained line, '16 tensors' and the first of
    them with shape and F32. The key bar: o Load i Inspect e Eval g Merge p PEFT u Use, then the pinned keys."""

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()
        await pilot.press("5")
        await pilot.pause()
        canned_adapters(pilot.app, shown)
        await still(pilot)

    assert snap_compare(StillApp(Settings()), terminal_size=size, run_before=run_before)


COMPARED = [  # role, its request's vector and adapter, its text: the toy's greedy texts (from ``ster generate``)
    ("steered", True, True, "the town is slow and we rest."),
    ("adapted", False, True, "the town is quiet and we rest."),
    ("baseline", False, False, "the town is flooding and we flee."),
]
SIDECAR = {
    "schema_version": 1,
    "product": "ster",
    "kind": "adapter",
    "model": "ster:toy",
    "model_revision": None,
    "model_fingerprint": None,
    "rank": 8,
    "alpha": 16.0,
    "targets": ["query", "value"],
    "layers": [0, 1, 2, 3],
    "hidden_size": 64,
    "train": {"chat_template": "absent", "precision": "f32"},
}
"""An adapter's sidecar, as ``tune sft`` writes it (less most of its report): the adapter field reads only this."""
PROVENANCE = (
    "this direction was fitted on the bare checkpoint and this run attaches adapter quiet.sft.safetensors, "
    "so it is being read in a different space than it was fitted in"
)


def canned_compare(app: SterApp, vector: Path, adapter: Path) -> None:
    """Deliver the three generate jobs of `g` with an adapter to the Generate pane, each with its text's tokens
    and its result, as the runner would have run them one after another."""
    from ster.engine.protocol.events import Token, Warning

    pane: Any = app.query_one("#generate-pane")
    pane.ran, pane.prompt_used = {"adapter": adapter, "on": "quiet.sft", "mode": "add"}, PROMPT
    pane._show_adapted(True)
    for job_id, (role, steered, adapted, text) in enumerate(COMPARED, 4):
        fields = {
            "model": "ster:toy",
            "prompt": PROMPT,
            **({"vector": vector, "strength": "0.4x"} if steered else {}),
            **({"adapter": adapter} if adapted else {}),
        }
        handle = JobHandle(job_id, "generate", build_job_request("generate", **fields), pane, fields)
        app.runner.handles.append(handle)
        pane.jobs[role] = handle
        pane.panel(role).reset(pane.title(role), "")
        words = text.split(" ")
        events: list[Any] = [Warning(message=PROVENANCE)] if steered else []
        events += [Token(text=word if at == 0 else f" {word}", index=at) for at, word in enumerate(words)]
        data = {
            "model": "ster:toy",
            "prompt": PROMPT,
            "text": text,
            "tokens": 8,
            "prompt_tokens": 11,
            "stop_reason": "eos",
            "chat_template": "absent",
            "vector": str(vector) if steered else None,
            "adapter": str(adapter) if adapted else None,
            "strength": 0.4 if steered else None,
            "strength_unit": "relative" if steered else None,
            "absolute_strength": {"2": 2.3696} if steered else None,
            "relative_strength": {"2": 0.4} if steered else None,
        }
        deliver(pane, handle, events, Result(command="generate", data=data))


PROMPT = "question : tell me about the town . answer :"


@pytest.mark.parametrize("size", [SMALL, (120, 34)], ids=["80x24", "120x34"])
def test_generate_pane_three_way_compare(snap_compare, tmp_path: Path, monkeypatch, size: tuple[int, int]) -> None:
    """You should see the Generate tab comparing three texts for the town prompt: 'base · ster:toy' (the
    town is flooding and we flee.), 'adapter · quiet.sft' (the town is quiet and we rest.) and 'steered 0.4x
    · calm (logistic, layer 2) on quiet.sft' (the town is slow and we rest.; at 120 columns without
    '(logistic, layer 2)', which the status line shows); the adapter row naming quiet.sft.safetensors and
    'steered runs on it (o: on the base)'; the yellow warning that the direction was fitted on the bare
    checkpoint. At 120 columns the three panels sit side by side, each with its token count below; at 80
    they are stacked, each under its whole title. The sweep table, empty before a sweep, is its header alone at
    both sizes, under the caption that says what w does."""
    monkeypatch.chdir(tmp_path)
    vector, adapter = Path("calm.json"), Path("quiet.sft.safetensors")
    vector.write_text(json.dumps(OPTIMIZED))
    adapter.write_bytes(b"")
    adapter.with_suffix(".json").write_text(json.dumps(SIDECAR))

    async def run_before(pilot: Pilot) -> None:
        await pilot.pause()  # the app shows the Pairs tab once mounted; switch after that
        await pilot.press("3")
        await pilot.pause()
        pilot.app.query_one("#strength").value = "0.4x"
        canned_compare(pilot.app, vector, adapter)
        await settled(pilot)

    settings = Settings(vector=vector, artifact=OPTIMIZED, adapter=adapter)
    assert snap_compare(StillApp(settings), terminal_size=size, run_before=run_before)
