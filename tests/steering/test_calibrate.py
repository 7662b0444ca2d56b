"""``ster calibrate`` on the toy: the chosen strengths keep their KL budget and move held-out behaviour their
way, generate steers at them, the search's arithmetic, every refusal, and Ctrl-C with --resume."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from ster.engine.steering.calibrate import at_budget, behaviour_at, pareto, plan_next, score
from ster.engine.steering.calibration_record import Point, Trial
from ster.engine.steering.study import study_path
from tests.protocol.test_interrupt import interrupt_at_line, spawn

BASE = ["calibrate", "--model", "ster:toy", "--pairs", "ster:pairs"]


def point(strength: float, kl: float, behaviour: float = 0.0) -> Point:
    return Point(strength=strength, kl=kl, kl_first=kl, behaviour=behaviour, preferred=0.5, probability=0.5)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    from ster.cli import main

    out = tmp_path_factory.mktemp("calibrated") / "calm.json"
    assert main(["--json", *BASE, "--output", str(out)]) == 0
    return json.loads(out.read_text()), out


def test_the_chosen_strengths_keep_the_budget_and_move_behaviour_their_way(calibrated) -> None:
    artifact, out = calibrated
    record = artifact["calibration"]
    assert record["kl_budget"] == 0.25 and record["neutral"] == "ster:neutral" and record["neutral_prompts"] == 72
    assert record["fit_pairs"] == 9 and record["holdout_pairs"] == 3
    positive, negative = record["positive"], record["negative"]
    assert positive["strength"] > 0 > negative["strength"]
    for side in (positive, negative):
        assert 0 < side["kl"] <= 0.25 and side["kl_first"] >= 0 and side["fluency"] > 0
    assert positive["behaviour_shift"] > 0 > negative["behaviour_shift"]
    both = [t for t in record["trials"] if t["positive"] and t["negative"]]  # moving behaviour both ways ranks first
    best = max(both, key=lambda t: t["score"])
    assert [v["layer"] for v in artifact["vectors"]] == best["layers"] and artifact["method"] == best["method"]
    assert not study_path(out).exists()  # the study is gone once the artifact is written


def test_a_sweep_without_strengths_walks_around_the_calibrated_ones_and_says_so(cli, calibrated) -> None:
    artifact, out = calibrated
    run = cli(
        "--json",
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        out,
        "--prompts",
        "ster/data/examples/prompts.json",
        "--max-new-tokens",
        "2",
        "--neutral-count",
        "2",
    )
    assert run.code == 0, run.err
    positive, negative = (round(artifact["calibration"][side]["strength"], 4) for side in ("positive", "negative"))
    expected = sorted({round(step * s, 4) for s in (positive, negative) for step in (0.5, 1.0, 2.0)} | {0.0})
    assert [row["strength"] for row in run.events[-1]["data"]["rows"]] == expected
    assert any(
        e["type"] == "log"
        and e["message"].startswith("sweeping half, once and twice the artifact's calibrated strengths")
        for e in run.events
    )


def test_generate_steers_at_the_calibrated_strength_and_says_so(cli, calibrated) -> None:
    artifact, out = calibrated
    run = cli(
        "--json",
        "generate",
        "--model",
        "ster:toy",
        "--vector",
        out,
        "--prompt",
        "question : tell me about the town . answer :",
    )
    assert run.code == 0, run.err
    result = run.events[-1]["data"]
    assert result["strength"] == round(artifact["calibration"]["positive"]["strength"], 4)
    assert result["strength_unit"] == "relative"
    assert any(
        e["type"] == "log" and e["message"].startswith("steering at the artifact's calibrated strength")
        for e in run.events
    )
    given = cli(
        "--json", "generate", "--model", "ster:toy", "--vector", out, "--strength", "0.4x", "--prompt", "the sea is"
    )
    assert given.events[-1]["data"]["strength"] == 0.4  # a given strength wins


def test_inspect_shows_the_calibration(cli, calibrated) -> None:
    _, out = calibrated
    run = cli("inspect", out)
    assert run.code == 0 and json.loads(run.out)["calibration"]["kl_budget"] == 0.25


def test_the_budget_is_read_off_the_ladder() -> None:
    ladder = [point(0, 0), point(0.1, 0.01), point(0.2, 0.04), point(0.4, 0.16), point(-0.1, 0.02), point(-0.2, 0.5)]
    assert at_budget(ladder, 1, 0.04) == pytest.approx(0.2)
    assert at_budget(ladder, 1, 0.09) == pytest.approx(0.3, rel=1e-9)  # KL ∝ s² between rungs: log-log exact
    assert at_budget(ladder, 1, 1.0) == 0.4  # every rung within the budget: the last rung
    assert at_budget(ladder, -1, 0.005) == pytest.approx(0.1 * 0.5)  # below the first rung: KL ∝ s²
    assert at_budget([point(0, 0)], 1, 0.1) is None


def test_a_trial_scores_the_behaviour_each_sign_moves_at_its_budget() -> None:
    ladder = [
        point(0, 0, 1.0),
        point(0.1, 0.01, 1.5),
        point(0.2, 0.04, 2.5),
        point(-0.1, 0.01, 1.2),
        point(-0.2, 0.04, 1.4),
    ]
    assert behaviour_at(ladder, 0.15) == pytest.approx(2.0)
    assert behaviour_at(ladder, 0.05) == pytest.approx(1.25)
    positive, negative, value = score(ladder, 0.04)
    assert positive == pytest.approx(0.2) and negative is None  # the negative side moved behaviour up, not down
    assert value == pytest.approx(1.5)


def test_the_front_keeps_only_points_nothing_beats_on_both_measures() -> None:
    trial = Trial(
        layers=[1],
        method="caa",
        positive=None,
        negative=None,
        score=0.0,
        points=[
            point(0, 0, 1.0),
            point(0.1, 0.01, 1.5),
            point(0.2, 0.05, 1.2),
            point(0.4, 0.2, 3.0),
            point(-0.1, 0.02, 0.5),
        ],
    )
    front = pareto([trial])
    assert [(p.strength, p.behaviour_shift) for p in front] == [(0.1, 0.5), (0.4, 2.0), (-0.1, 0.5)]


def test_the_plan_screens_every_layer_then_methods_then_ranges() -> None:
    layers = list(range(30))
    trials: list[Trial] = []
    seen = []
    while (candidate := plan_next(layers, trials, 40)) is not None:
        span, method = candidate
        seen.append((tuple(span), method))
        value = 1.0 if span == [21] and method == "logistic" else 0.9 if span == [21] else 0.1 * (span[0] % 7)
        trials.append(
            Trial(layers=span, method=method, points=[point(0, 0)], positive=None, negative=None, score=value)
        )
    assert seen[:30] == [((layer,), "caa") for layer in layers]
    assert seen[30:36] == [
        ((21,), "pca"),
        ((21,), "logistic"),
        ((6,), "pca"),
        ((6,), "logistic"),
        ((13,), "pca"),
        ((13,), "logistic"),
    ]
    assert seen[36:] == [
        ((21, 22), "logistic"),
        ((20, 21), "logistic"),
        ((20, 21, 22), "logistic"),
        ((19, 20, 21, 22, 23), "logistic"),
    ]
    assert [span for span, _ in (c for c in seen[:10])] == [(i,) for i in range(10)]
    few = plan_next(layers, [], 8)
    assert few == ([0], "caa")


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (["--kl-budget", "0"], "--kl-budget must be a number above 0 (nats per token); got 0"),
        (["--kl-budget", "-1"], "--kl-budget must be a number above 0"),
        (["--kl-budget", "nan"], "--kl-budget must be a number above 0"),
        (["--trials", "0"], "--trials"),
        (["--neutral", "{empty}"], "it contains no prompts"),
        (["--neutral", "{long}"], "has 1001 prompts; KL is measured on at most 1000"),
        (["--resume"], "--resume found no calibration study at"),
    ],
)
def test_bad_input_gets_one_sentence_and_nothing_is_written(
    cli, tmp_path: Path, flags: list[str], sentence: str
) -> None:
    (tmp_path / "empty.json").write_text(json.dumps({"prompts": []}))
    (tmp_path / "long.json").write_text(json.dumps({"prompts": [f"request {i}" for i in range(1001)]}))
    flags = [f.format(empty=tmp_path / "empty.json", long=tmp_path / "long.json") for f in flags]
    out = tmp_path / "out" / "a.json"
    out.parent.mkdir()
    run = cli(*BASE, *flags, "--output", out)
    assert run.code == 1, run.err
    assert sentence in run.err and "Traceback" not in run.err
    assert list(out.parent.iterdir()) == []


def test_a_study_left_behind_is_not_overwritten_without_resume(cli, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    study = study_path(out)
    study.write_text(json.dumps({"identity": {}, "trials": []}))
    run = cli(*BASE, "--output", out)
    assert run.code == 1 and "a calibration study from an interrupted run is at" in run.err
    assert json.loads(study.read_text()) == {"identity": {}, "trials": []} and not out.exists()
    other = cli(*BASE, "--output", out, "--resume")
    assert other.code == 1 and "was started with" in other.err


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="POSIX signals")
def test_ctrl_c_leaves_a_study_that_resume_finishes_as_the_whole_run_does(tmp_path: Path) -> None:
    from ster.engine.protocol.paths import EXAMPLES_DIR

    prompts = json.loads((EXAMPLES_DIR / "neutral.json").read_text())["prompts"]
    neutral = tmp_path / "neutral.json"
    neutral.write_text(json.dumps({"prompts": prompts * 6}))  # a long final measurement after the search
    long = [*BASE, "--neutral", neutral]
    whole_out = tmp_path / "whole" / "calm.json"
    whole_out.parent.mkdir()
    whole = spawn("-m", "ster", *long, "--output", whole_out)
    out = tmp_path / "cut" / "calm.json"
    out.parent.mkdir()
    proc = spawn("-m", "ster", *long, "--output", out)
    # trial 1 is saved; trial 2 is running
    err = interrupt_at_line(proc, lambda line: line.startswith("trial 1: ") and " score " in line, "trial 1 finished")
    assert proc.returncode == 130, err
    last = err.splitlines()[-1]
    assert last.startswith("cancelled after trial ") and last.endswith(
        f"the study at {study_path(out)} continues it when the same command is given with --resume"
    ), err
    assert sorted(p.name for p in out.parent.iterdir()) == ["calm.study.json"]
    saved = len(json.loads(study_path(out).read_text())["trials"])
    assert saved >= 1

    resumed = spawn("-m", "ster", *long, "--output", out, "--resume")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert f"resuming the study at {study_path(out)} after {saved} trials" in err
    assert whole.wait(timeout=120) == 0
    assert json.loads(out.read_text()) == json.loads(whole_out.read_text())
    assert sorted(p.name for p in out.parent.iterdir()) == ["calm.json"]
