"""The steering loop on SmolLM2-135M-Instruct (``real`` marker; CI runs these).

Two hand-written pair sets of 24 pairs each for one trait — calm versus alarmed answers
to the same question — one to fit, one held out; held-out prompts for the sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.cli import main

pytestmark = pytest.mark.real
DATA = Path(__file__).parents[1] / "data"
FIT, HOLDOUT, PROMPTS = DATA / "calm-fit.json", DATA / "calm-holdout.json", DATA / "calm-prompts.json"


@pytest.fixture(scope="module")
def calm(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """optimize with its defaults (every layer) on the fitting set, as a new user runs it."""
    out = tmp_path_factory.mktemp("calm") / "calm.json"
    assert main(["optimize", "--model", str(smol), "--pairs", str(FIT), "--output", str(out)]) == 0
    return out


def test_optimize_over_every_layer_picks_a_middle_layer_not_the_deepest(calm: Path) -> None:
    """Ranked on separation, not on the raw margin that grows with depth (which picked layer 29 of 30)."""
    layer = json.loads(calm.read_text())["vectors"][0]["layer"]
    assert 14 <= layer <= 24


def test_the_selected_direction_separates_held_out_pairs(cli, smol: Path, calm: Path) -> None:
    run = cli("evaluate", "--model", smol, "--pairs", HOLDOUT, "--vector", calm)
    assert run.code == 0, run.err
    result = run.json
    assert result["pair_count"] == 24 and result["chat_template"] == "applied"
    assert all(layer["accuracy"] >= 0.9 for layer in result["layers"])


def test_strength_zero_reproduces_the_unsteered_text_and_the_default_strength_moves_it(
    cli, smol: Path, calm: Path
) -> None:
    prompt = json.loads(PROMPTS.read_text())["prompts"][0]
    baseline = cli("generate", "--model", smol, "--prompt", prompt, "--max-new-tokens", "24").json
    zero = cli(
        "generate", "--model", smol, "--prompt", prompt, "--max-new-tokens", "24", "--vector", calm, "--strength", "0"
    ).json
    assert zero["text"] == baseline["text"]
    pushed = cli("generate", "--model", smol, "--prompt", prompt, "--max-new-tokens", "24", "--vector", calm).json
    assert (pushed["strength"], pushed["strength_unit"]) == (0.4, "relative")
    assert pushed["text"] != baseline["text"]


def test_the_default_sweep_moves_the_text_distinguishably(cli, smol: Path, calm: Path) -> None:
    run = cli("sweep", "--model", smol, "--vector", calm, "--prompts", PROMPTS, "--max-new-tokens", "40")
    assert run.code == 0, run.err
    result = run.json
    rows = {row["strength"]: row for row in result["rows"]}
    assert list(rows) == [-0.8, -0.4, -0.2, 0, 0.2, 0.4, 0.8] and result["strength_unit"] == "relative"
    assert result["moved"] and "no strength moved" not in run.err
    toward = rows[0.4]
    assert toward["changed"] == 6 and toward["fluent"]
    assert toward["distinguishable"] and toward["effect"] > toward["threshold"] > 0
    # twice the default costs more than heretic's KL of damage, 0.5, and more than the budget the default keeps
    assert rows[0.8]["kl"] > 0.5 > result["kl_budget"] >= rows[0.4]["kl"] > rows[0.2]["kl"] > 0
    assert rows[0.8]["fluency"] > rows[0.4]["fluency"] > 1  # the unsteered model finds the texts less likely
    assert result["within_budget"]["positive"] == 0.4 and result["suggested"]["positive"] in (0.4, 0.8)
    assert rows[-0.8]["effect"] < 0


def test_a_direction_fitted_out_of_format_reads_worse(tmp_path: Path, smol: Path) -> None:
    """The spec's crossed chat-template finding: fit off and evaluate auto, and the reverse."""
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import run_job
    from ster.engine.steering.requests import EvaluateRequest, TrainRequest

    store, sink = ModelStore(), (lambda event: None)
    accuracy = {}
    for fitted in ("off", "auto"):
        vector = tmp_path / f"{fitted}.json"
        request = TrainRequest(model=str(smol), pairs=FIT, output=vector, chat_template=fitted)
        assert run_job("train", request, sink, models=store).type == "result"
        for evaluated in ("off", "auto"):
            request = EvaluateRequest(model=str(smol), pairs=HOLDOUT, vector=vector, chat_template=evaluated)
            layers = run_job("evaluate", request, sink, models=store).data["layers"]
            accuracy[fitted, evaluated] = sum(layer["accuracy"] for layer in layers) / len(layers)
    assert min(accuracy["off", "off"], accuracy["auto", "auto"]) > max(accuracy["off", "auto"], accuracy["auto", "off"])
