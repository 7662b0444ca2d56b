"""Finite but absurd inputs are refused rather than fitted: differences that carry no signal.

(Artifacts whose directions are not unit length, 1e30 or all zeros, are refused in test_artifact.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ster.engine.protocol.errors import Refusal
from ster.engine.steering.directions import NO_SIGNAL, fit

SAME = {
    "positive": "question : how is the sea ? answer : the sea is calm and we rest .",
    "negative": "question : how is the sea ? answer : the sea is wild and we flee .",
}


def last_error(run) -> str:
    return run.err.strip().splitlines()[-1]


def write_pairs(path: Path, pairs: list[dict]) -> Path:
    path.write_text(json.dumps({"trait_name": "calm", "pairs": pairs}))
    return path


def test_pca_on_five_identical_pairs_is_refused(cli, tmp_path: Path) -> None:
    pairs = write_pairs(tmp_path / "same.json", [SAME] * 5)
    out = tmp_path / "out.json"
    run = cli("train", "--model", "ster:toy", "--pairs", pairs, "--output", out, "--method", "pca", "--layers", "2")
    assert run.code == 1 and run.out == "" and not out.exists()
    assert last_error(run).startswith(
        "error: pca finds no direction: the pairs' differences do not vary (each lies "
        "within 0 of their mean, against states of norm "
    )
    assert last_error(run).endswith(
        "so every direction explains them equally; remove duplicate pairs (pairs inspect finds them) or use caa"
    )
    assert cli("optimize", "--model", "ster:toy", "--pairs", pairs, "--output", out).code == 1 and not out.exists()
    caa = cli("train", "--model", "ster:toy", "--pairs", pairs, "--output", out, "--layers", "2")
    assert caa.code == 0 and caa.json["layers"][0]["train_accuracy"] == 1.0  # one real difference, five times


@pytest.mark.parametrize("method", ["caa", "pca", "logistic"])
def test_pairs_whose_sides_read_the_same_are_refused(cli, tmp_path: Path, method: str) -> None:
    twins = [{"positive": p, "negative": p} for p in (SAME["positive"], SAME["negative"], "the town is slow .")]
    pairs = write_pairs(tmp_path / "twins.json", twins)
    run = cli("train", "--model", "ster:toy", "--pairs", pairs, "--output", tmp_path / "o.json", "--method", method)
    assert run.code == 1 and not (tmp_path / "o.json").exists()
    assert last_error(run).startswith(
        f"error: {method} finds no direction: every pair's two sides read the same "
        f"(the largest difference is 0, against states of norm "
    )


def states(count: int, width: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed)) * 30


def test_differences_below_the_tolerance_are_rounding_not_signal() -> None:
    base = states(6)
    scale = float(base.double().norm(dim=1).mean())
    tiny = states(6, seed=1) / 30 * scale * NO_SIGNAL / 10  # each difference about a tenth of the tolerance
    for method in ("caa", "pca", "logistic"):
        with pytest.raises(Refusal, match="every pair's two sides read the same"):
            fit(method, base + tiny, base)
    real = states(6, seed=2) / 30 * scale * 1e-2
    for method in ("caa", "pca", "logistic"):
        assert abs(float(fit(method, base + real, base).double().norm()) - 1) < 1e-6


def test_pca_needs_variance_and_caa_a_mean() -> None:
    base = states(4)
    shift = torch.zeros(16)
    shift[3] = 5.0
    with pytest.raises(Refusal, match="pca finds no direction: the pairs' differences do not vary"):
        fit("pca", base + shift, base)
    assert torch.allclose(fit("caa", base + shift, base), torch.nn.functional.one_hot(torch.tensor(3), 16).float())
    mirrored = torch.cat([base[:2] + shift, base[2:] - shift])  # two pairs one way, two the other: the mean is 0
    with pytest.raises(Refusal, match="caa finds no direction: the pairs' differences cancel out"):
        fit("caa", mirrored, base)
    assert abs(float(fit("pca", mirrored, base).norm()) - 1) < 1e-6
