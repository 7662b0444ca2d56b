"""Fixtures of the tune tests: adapters trained once on the real model, shared by the modules that judge them."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
FORMAT_TRAIN, FORMAT_HELD = DATA / "tune" / "format-train.json", DATA / "tune" / "format-holdout.json"
CALM_FIT, CALM_HELD, CALM_PROMPTS = DATA / "calm-fit.json", DATA / "calm-holdout.json", DATA / "calm-prompts.json"


@pytest.fixture(scope="session")
def trained(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three adapters (sft, dpo, reward) on SmolLM2, trained once for the session."""
    from ster.cli import main

    where = tmp_path_factory.mktemp("tuned")
    runs = {
        "sft": [
            "tune",
            "sft",
            "--examples",
            FORMAT_TRAIN,
            "--learning-rate",
            "2e-3",
            "--accumulation",
            "4",
            "--epochs",
            "2",
        ],
        "dpo": ["tune", "dpo", "--pairs", CALM_FIT, "--learning-rate", "5e-4", "--accumulation", "4"],
        "reward": [
            "tune",
            "reward",
            "--pairs",
            CALM_FIT,
            "--learning-rate",
            "2e-3",
            "--accumulation",
            "4",
            "--epochs",
            "2",
        ],
    }
    paths = {}
    for name, args in runs.items():
        paths[name] = where / f"{name}.safetensors"
        assert main([*map(str, args), "--model", str(smol), "--output", str(paths[name])]) == 0, name
    return paths
