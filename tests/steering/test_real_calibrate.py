"""``ster calibrate`` on SmolLM2-135M-Instruct (``real`` marker; CI runs these).

A narrowed search (the last third of the layers, twelve candidates) keeps the suite short; the full
default calibration of both real models is measured by ``bench/calibrate_speed.py`` and reported in the
README. What is checked here holds for any candidate the search chooses: both signs get a strength within
the KL budget on the whole neutral set, each moves the held-out behaviour its own way, and ``generate``
then steers at the positive one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.cli import main

pytestmark = pytest.mark.real
DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def calibrated(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibrated") / "calm.json"
    code = main(
        [
            "calibrate",
            "--model",
            str(smol),
            "--pairs",
            str(DATA / "calm-fit.json"),
            "--holdout",
            str(DATA / "calm-holdout.json"),
            "--layers",
            "20..30",
            "--trials",
            "12",
            "--judge",
            "none",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_both_signs_move_held_out_behaviour_their_way_within_the_budget(calibrated: Path) -> None:
    record = json.loads(calibrated.read_text())["calibration"]
    assert record["holdout_pairs"] == 24 and record["fit_pairs"] == 24 and record["neutral_prompts"] == 72
    positive, negative = record["positive"], record["negative"]
    assert positive["strength"] > 0 > negative["strength"]
    for side in (positive, negative):
        assert 0 < side["kl"] <= record["kl_budget"] == 0.25
        assert side["fluency"] is not None and side["fluency"] < 2.0  # answers stay about as natural as unsteered
    assert positive["behaviour_shift"] > 1.0 and negative["behaviour_shift"] < -1.0  # nats, over 24 pairs
    assert positive["preferred"] >= record["baseline"]["preferred"] >= negative["preferred"]


def test_generate_steers_smollm2_at_the_calibrated_strength(cli, smol: Path, calibrated: Path) -> None:
    prompt = json.loads((DATA / "calm-prompts.json").read_text())["prompts"][0]
    steered = cli(
        "--json", "generate", "--model", smol, "--vector", calibrated, "--prompt", prompt, "--max-new-tokens", "24"
    )
    plain = cli("generate", "--model", smol, "--prompt", prompt, "--max-new-tokens", "24")
    assert steered.code == 0 and plain.code == 0, steered.err + plain.err
    result = steered.events[-1]["data"]
    record = json.loads(calibrated.read_text())["calibration"]
    assert result["strength"] == round(record["positive"]["strength"], 4) and result["strength_unit"] == "relative"
    assert result["text"] != plain.json["text"]
