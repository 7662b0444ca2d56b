"""``--adapter`` on generate, extract, train, optimize, evaluate and sweep: reading and steering an adapted model.

A fresh adapter (B zero) is the identity, bit for bit; an adapter with a non-zero update
changes what every command reads, and each result records which adapter it went through.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ster.engine.model.adapters.lora import attached, load_adapter
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from tests.tune.adapter_files import PROMPT, write_adapter


@pytest.fixture
def moved(tmp_path: Path) -> Path:
    path = tmp_path / "moved.safetensors"
    write_adapter(path, b_scale=0.4, targets=("query", "value", "up"))
    return path


def run_ok(cli, *args):
    run = cli(*args)
    assert run.code == 0, run.err
    return run


def test_a_fresh_adapter_is_the_identity(cli, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.safetensors"
    write_adapter(fresh, targets=("query", "key", "value", "output", "gate", "up", "down"))
    base = run_ok(cli, "generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "8").json
    through = run_ok(
        cli, "generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "8", "--adapter", fresh
    ).json
    assert through["text"] == base["text"] and (base["adapter"], through["adapter"]) == (None, str(fresh))
    source = resolve_model("ster:toy")
    config = load_config(source.config)
    decoder = load_decoder(source, config, "f32", torch.device("cpu"))
    _, adapter = load_adapter(fresh, config, torch.device("cpu"))
    ids = torch.tensor([[1, 11, 12, 13, 14, 15]])
    with torch.inference_mode():
        plain = decoder(ids, vocab="all").logits
        with attached(decoder, adapter):
            adapted = decoder(ids, vocab="all").logits
    assert torch.equal(plain, adapted)


def test_generate_combines_an_adapter_with_a_vector(cli, tmp_path: Path, moved: Path) -> None:
    vector = tmp_path / "calm.json"
    run_ok(cli, "train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", vector, "--layers", "2")
    common = ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "8"]
    steered = run_ok(cli, *common, "--vector", vector, "--strength", "1x").json
    both = run_ok(cli, *common, "--vector", vector, "--strength", "1x", "--adapter", moved)
    adapted = run_ok(cli, *common, "--adapter", moved).json
    assert both.json["vector"] == str(vector) and both.json["adapter"] == str(moved)
    assert both.json["text"] != steered["text"] and both.json["text"] != adapted["text"]
    # the direction was fitted on the bare checkpoint, and this run reads it through an adapter
    assert (
        f"warning: this direction was fitted on the bare checkpoint and this run attaches adapter {moved}, so it "
        "is being read in a different space than it was fitted in"
    ) in both.err.splitlines()


def test_extract_reads_through_the_adapter(cli, tmp_path: Path, moved: Path) -> None:
    bare, through = tmp_path / "bare.json", tmp_path / "through.json"
    result = run_ok(cli, "extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", bare).json
    assert result["adapter"] is None
    result = run_ok(
        cli, "extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", through, "--adapter", moved
    ).json
    assert result["adapter"] == str(moved)
    a, b = json.loads(bare.read_text()), json.loads(through.read_text())
    assert b["adapter"] == str(moved) and a["adapter"] is None
    assert a["records"][0]["layers"]["0"] != b["records"][0]["layers"]["0"]


def test_a_direction_records_the_adapter_it_was_fitted_through(cli, tmp_path: Path, moved: Path) -> None:
    bare, through = tmp_path / "bare.json", tmp_path / "through.json"
    run_ok(cli, "train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", bare, "--layers", "2")
    summary = run_ok(
        cli,
        "train",
        "--model",
        "ster:toy",
        "--pairs",
        "ster:pairs",
        "--output",
        through,
        "--layers",
        "2",
        "--adapter",
        moved,
    ).json
    assert summary["adapter"] == str(moved)
    assert "adapter" not in json.loads(bare.read_text())  # written exactly as before adapters existed
    assert json.loads(through.read_text())["adapter"] == str(moved)
    assert json.loads(bare.read_text())["vectors"] != json.loads(through.read_text())["vectors"]
    assert run_ok(cli, "inspect", through).json["adapter"] == str(moved)
    quiet = run_ok(
        cli, "evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--vector", through, "--adapter", moved
    )
    assert "warning" not in quiet.err and quiet.json["adapter"] == str(moved)
    loud = run_ok(cli, "evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--vector", through)
    assert (
        f"warning: this direction was fitted through adapter {moved} and this run reads the bare checkpoint, so "
        "it is being read in a different space than it was fitted in"
    ) in loud.err.splitlines()
    assert loud.json["adapter"] is None and loud.json["layers"] != quiet.json["layers"]


def test_optimize_and_sweep_take_an_adapter(cli, tmp_path: Path, moved: Path) -> None:
    out = tmp_path / "best.json"
    result = run_ok(
        cli,
        "optimize",
        "--model",
        "ster:toy",
        "--pairs",
        "ster:pairs",
        "--output",
        out,
        "--layers",
        "1,2",
        "--adapter",
        moved,
    ).json
    assert result["adapter"] == str(moved)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [PROMPT]}))
    sweep = run_ok(
        cli,
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        out,
        "--prompts",
        prompts,
        "--strengths=0.4x",
        "--max-new-tokens",
        "4",
        "--adapter",
        moved,
    )
    assert sweep.json["adapter"] == str(moved) and "warning: this direction" not in sweep.err
    generated = run_ok(
        cli, "generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "4", "--adapter", moved
    ).json
    baseline = next(row for row in sweep.json["rows"] if row["strength"] == 0)
    assert baseline["outputs"][0]["text"] == generated["text"]  # strength 0 is the adapted model's own text
