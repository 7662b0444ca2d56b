"""The sweep's cost and behaviour per strength on the toy: each row measures what the measures give for that
strength alone (the measures themselves are checked against transformers in test_measures), the budget's
suggestion, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from ster.engine.steering.sweep import within_budget

PROMPTS = "ster/data/examples/prompts.json"


@pytest.fixture(scope="module")
def vector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ster.cli import main

    out = tmp_path_factory.mktemp("sweep-measures") / "calm.json"
    assert main(["train", "--model", "ster:toy", "--pairs", "ster:pairs", "--layers", "2", "--output", str(out)]) == 0
    return out


def test_each_row_measures_its_strength_as_the_measures_do_alone(cli, vector: Path) -> None:
    import torch  # noqa: F401  (the measures below are torch's)

    from ster.engine.model.loading import ModelStore
    from ster.engine.model.requests import ModelRequest
    from ster.engine.pairs.model import load_pairs
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.protocol.paths import example_path
    from ster.engine.steering.calibrate import answered_pairs
    from ster.engine.steering.intervention import added
    from ster.engine.steering.measures import Rows, behaviours, greedy_continuations, kl_costs

    run = cli(
        "--json",
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        PROMPTS,
        "--strengths=-0.4x,0.4x",
        "--max-new-tokens",
        "4",
        "--neutral-count",
        "4",
        "--holdout",
        "ster:pairs",
    )
    assert run.code == 0, run.err
    result = run.events[-1]["data"]
    assert (result["neutral"], result["neutral_prompts"], result["holdout_pairs"]) == ("ster:neutral", 4, 12)
    rows = {row["strength"]: row for row in result["rows"]}
    assert rows[0.0]["kl"] == 0 and rows[0.0]["behaviour_shift"] == 0 and rows[0.0]["fluency"] == 1

    store = ModelStore()
    ctx = JobContext(lambda event: None, models=store)
    checkpoint = store.open(ModelRequest(model="ster:toy"), ctx)
    model, codec = store.decoder(checkpoint, ctx), checkpoint.codec
    neutral = json.loads(example_path("ster:neutral").read_text())["prompts"]
    chosen = [codec.encode_prompt(neutral[i * len(neutral) // 4]) for i in range(4)]  # spread evenly
    items = list(zip(chosen, greedy_continuations(model, chosen, 16, codec.eos_ids)))
    pairs = answered_pairs(codec, load_pairs(Path("ster/data/examples/pairs.json")).pairs, checkpoint.context)[0]
    layer = json.loads(vector.read_text())["vectors"][0]
    for strength in (-0.4, 0.4):
        alone = Rows.of(
            model, [added({2: layer["values"]}, row) for row in ({2: 0.0}, {2: strength * layer["activation_spread"]})]
        )
        kl = math.fsum(cost.mean[1] for cost in kl_costs(model, items, alone)) / 4
        first = math.fsum(cost.first[1] for cost in kl_costs(model, items, alone)) / 4
        gaps = behaviours(model, pairs, alone)
        assert rows[strength]["kl"] == pytest.approx(kl, rel=1e-9) and kl > 0
        assert rows[strength]["kl_first"] == pytest.approx(first, rel=1e-9)
        shift = math.fsum(g[1] - g[0] for g in gaps) / len(gaps)
        assert rows[strength]["behaviour_shift"] == pytest.approx(shift, rel=1e-9, abs=1e-12)
        assert rows[strength]["preferred"] == sum(g[1] > 0 for g in gaps) / len(gaps)
    assert rows[0.4]["behaviour_shift"] > 0 > rows[-0.4]["behaviour_shift"]  # toward calm and away
    assert any(
        e["type"] == "log" and e["message"].startswith("within the KL budget of 0.25 (mean over 4 neutral")
        for e in run.events
    )


def test_without_a_holdout_no_behaviour_is_claimed(cli, vector: Path) -> None:
    run = cli(
        "--json",
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        PROMPTS,
        "--strengths=0.4x",
        "--max-new-tokens",
        "2",
        "--neutral-count",
        "2",
    )
    assert run.code == 0, run.err
    result = run.events[-1]["data"]
    assert result["holdout_pairs"] is None
    assert all(
        row["behaviour"] is None and row["preferred"] is None and row["kl"] is not None for row in result["rows"]
    )


def test_the_budget_suggests_the_last_strength_before_the_first_over_it() -> None:
    rows = [
        SimpleNamespace(strength=s, kl=kl)
        for s, kl in [(-0.8, 0.9), (-0.4, 0.2), (-0.2, 0.05), (0.0, 0.0), (0.2, 0.1), (0.4, 0.3), (0.8, 0.2)]
    ]
    assert within_budget(rows, 1, 0.25) == 0.2  # 0.8 is under again, but past a strength over the budget
    assert within_budget(rows, -1, 0.25) == -0.4
    assert within_budget(rows, 1, 0.01) is None


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (["--kl-budget", "0"], "--kl-budget must be a number above 0 (nats per token); got 0"),
        (["--neutral-count", "0"], "--neutral-count"),
        (["--neutral", "{empty}"], "it contains no prompts"),
        (["--holdout", "{missing}"], "missing.json"),
    ],
)
def test_bad_input_gets_one_sentence(cli, tmp_path: Path, vector: Path, flags: list[str], sentence: str) -> None:
    (tmp_path / "empty.json").write_text(json.dumps({"prompts": []}))
    flags = [f.format(empty=tmp_path / "empty.json", missing=tmp_path / "missing.json") for f in flags]
    run = cli("sweep", "--model", "ster:toy", "--vector", vector, "--prompts", PROMPTS, *flags)
    assert run.code == 1, run.err
    assert sentence in run.err and "Traceback" not in run.err and run.err.count("\n") <= 2
