"""Every refusal of an adapter artifact (contract §3.2), through the commands that apply one.

Each case breaks one thing in an otherwise good artifact and checks the one sentence,
the exit status 1, and that nothing is printed on stdout. The header-level refusals come
before torch is imported (checked in a fresh interpreter).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ster.engine.model.adapters.artifact import sidecar_path
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from tests.conftest import REPO
from tests.tune.adapter_files import PROMPT, edit_sidecar, rewrite_tensors, write_adapter


def error(run) -> str:
    return run.err.strip().splitlines()[-1]


def generate(cli, adapter: Path, *extra: str):
    return cli(
        "generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "3", "--adapter", adapter, *extra
    )


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    path = tmp_path / "calm.safetensors"
    write_adapter(path, b_scale=0.1)
    return path


def _non_finite(tensors: dict) -> dict:
    tensors["layers.1.value.b"][0, 0] = float("nan")
    return tensors


def _misshapen(tensors: dict) -> dict:
    tensors["layers.0.query.a"] = torch.zeros(3, 64)
    return tensors


def _missing(tensors: dict) -> dict:
    del tensors["layers.2.value.b"]
    return tensors


def _with_head(tensors: dict) -> dict:
    tensors["reward.head"] = torch.zeros(1, 64)
    return tensors


@pytest.mark.parametrize(
    ("breakage", "sentence"),
    [
        (
            lambda p: sidecar_path(p).unlink(),
            "adapter {p} has no sidecar at {s}; the pair is written together and must travel together",
        ),
        (lambda p: p.unlink(), "failed to read adapter {p}: it does not exist"),
        (lambda p: edit_sidecar(p, product="wisent"), 'adapter artifact belongs to product "wisent", not Ster'),
        (
            lambda p: edit_sidecar(p, schema_version=2),
            "adapter artifact schema 2 is unsupported; this Ster build reads schema 1",
        ),
        (lambda p: edit_sidecar(p, rank=0), "adapter sidecar {s} declares rank 0, which stores nothing"),
        (lambda p: sidecar_path(p).write_text("{not json"), "invalid adapter sidecar JSON in {s}"),
        (lambda p: rewrite_tensors(p, _missing), "adapter artifact {p} is missing tensor layers.2.value.b"),
        (lambda p: rewrite_tensors(p, _misshapen), "adapter tensor layers.0.query.a has 3 rows, expected 4"),
        (lambda p: rewrite_tensors(p, _non_finite), "adapter tensor layers.1.value.b contains a non-finite value"),
        (
            lambda p: rewrite_tensors(p, _with_head),
            "adapter artifact carries a reward.head tensor but declares kind adapter",
        ),
        (
            lambda p: edit_sidecar(p, model="ster:other", model_fingerprint=None),
            'adapter was trained for model "ster:other", current model is "ster:toy"',
        ),
        (
            lambda p: edit_sidecar(p, model="ster:other", model_fingerprint="ster-fp1:" + "0" * 64),
            'adapter was trained for model "ster:other", current model is "ster:toy"',
        ),
        (lambda p: edit_sidecar(p, hidden_size=32), "adapter width 32 does not match model width 64"),
        (
            lambda p: p.write_bytes(b"not a safetensors file"),
            (
                "failed to read adapter {p}: it is not a safetensors file (its first 8 bytes are not the length of a header "
                "it holds)"
            ),
        ),
    ],
)
def test_a_broken_adapter_is_refused_in_one_sentence(cli, adapter: Path, breakage, sentence: str) -> None:
    breakage(adapter)
    run = generate(cli, adapter)
    assert (run.code, run.out) == (1, ""), run.err
    assert error(run) == "error: " + sentence.format(p=adapter, s=sidecar_path(adapter))


def test_a_reward_model_is_not_a_generation_adapter(cli, tmp_path: Path) -> None:
    reward = tmp_path / "judge.safetensors"
    write_adapter(reward, kind="reward", head_scale=1.0)
    for args in (
        ["generate", "--model", "ster:toy", "--prompt", PROMPT],
        ["extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", tmp_path / "x.json"],
        ["tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples"],
        ["tune", "merge", "--model", "ster:toy", "--output", tmp_path / "merged"],
    ):
        run = cli(*args, "--adapter", reward)
        assert (run.code, error(run)) == (1, "error: adapter artifact is a reward model, not a generation adapter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["judge.json", "judge.safetensors"]


def test_a_reward_model_without_its_head_is_refused(cli, tmp_path: Path) -> None:
    reward = tmp_path / "judge.safetensors"
    write_adapter(reward, kind="reward")
    rewrite_tensors(reward, lambda t: {k: v for k, v in t.items() if k != "reward.head"})
    run = cli("tune", "evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--adapter", reward)
    assert error(run) == "error: reward artifact is missing tensor reward.head, which is the head it exists to carry"


def test_a_generation_adapter_is_not_a_reward_model(adapter: Path) -> None:
    from ster.engine.model.adapters.apply import open_adapter
    from ster.engine.model.loading import model_store
    from ster.engine.model.requests import ModelRequest

    ctx = JobContext(lambda event: None)
    checkpoint = model_store(ctx).open(ModelRequest(model="ster:toy"), ctx)
    with pytest.raises(Refusal, match="^adapter artifact is a generation adapter, not a reward model$"):
        open_adapter(ctx, adapter, checkpoint, want="reward")
    sidecar, opened = open_adapter(ctx, adapter, checkpoint)
    assert sidecar.kind == "adapter" and opened.rank == 4 and len(opened.tensors) == 16


def test_a_steering_artifact_given_as_an_adapter_says_what_it_is(cli, tmp_path: Path) -> None:
    direction = tmp_path / "direction.json"
    assert (
        cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", direction, "--layers", "1").code == 0
    )
    for args in (
        ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--adapter", direction],
        ["tune", "inspect", direction],
        ["tune", "merge", "--model", "ster:toy", "--adapter", direction, "--output", tmp_path / "m"],
    ):
        run = cli(*args)
        assert (run.code, error(run)) == (
            1,
            (
                f"error: {direction} is a steering artifact, not a LoRA adapter sidecar: "
                "it carries trait_name and vectors where an adapter sidecar carries "
                "rank and targets"
            ),
        )


def test_an_adapter_given_as_a_steering_artifact_says_what_it_is(cli, adapter: Path) -> None:
    side = sidecar_path(adapter)
    run = cli("inspect", side)
    assert error(run) == (
        f"error: {side} is a LoRA adapter sidecar, not a steering artifact: it carries rank and "
        "targets where a steering artifact carries trait_name and vectors"
    )
    for args in (["inspect", adapter], ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", adapter]):
        run = cli(*args)
        assert (run.code, error(run)) == (
            1,
            (
                f"error: {adapter} is a LoRA adapter, not a steering artifact: its "
                f"sidecar {side} carries rank and targets where a steering artifact "
                "carries trait_name and vectors"
            ),
        )


def test_the_sidecar_given_as_the_adapter_names_the_file_to_give(cli, adapter: Path) -> None:
    run = generate(cli, sidecar_path(adapter))
    assert error(run) == (
        f"error: {sidecar_path(adapter)} is an adapter's sidecar; give the adapter file beside it, {adapter}"
    )


def test_an_output_over_the_adapters_sidecar_is_refused(cli, adapter: Path) -> None:
    before = sidecar_path(adapter).read_bytes()
    run = cli(
        "train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", sidecar_path(adapter), "--adapter", adapter
    )
    assert run.code == 1 and "is the sidecar of --adapter" in error(run)
    assert sidecar_path(adapter).read_bytes() == before


def test_an_adapter_for_the_same_checkpoint_under_another_name_is_accepted_with_a_note(
    cli, adapter: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "toy-copy"
    from ster.engine.model.resolve import TOY_DIR

    shutil.copytree(TOY_DIR, copy)
    run = cli("generate", "--model", copy, "--prompt", PROMPT, "--max-new-tokens", "2", "--adapter", adapter)
    assert run.code == 0, run.err
    assert f'"{copy}" has the same checkpoint fingerprint' in run.err


PROBE = (
    "import sys; from ster.cli import main; code = main(sys.argv[1:]); "
    "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
)


def test_header_refusals_come_before_torch_is_imported(tmp_path: Path) -> None:
    adapter = tmp_path / "a.safetensors"
    write_adapter(adapter, kind="reward")
    good = tmp_path / "good.safetensors"
    write_adapter(good)
    edit_sidecar(good, hidden_size=32)
    cases = [
        (["generate", "--model", "ster:toy", "--prompt", PROMPT, "--adapter", adapter], "reward model"),
        (
            [
                "extract",
                "--model",
                "ster:toy",
                "--input",
                "ster:prompts",
                "--output",
                tmp_path / "o.json",
                "--adapter",
                good,
            ],
            "adapter width 32",
        ),
        (
            [
                "train",
                "--model",
                "ster:toy",
                "--pairs",
                "ster:pairs",
                "--output",
                tmp_path / "o.json",
                "--adapter",
                tmp_path / "missing.safetensors",
            ],
            "failed to read adapter",
        ),
        (
            ["tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples", "--adapter", adapter],
            "reward model",
        ),
        (["tune", "merge", "--model", "ster:toy", "--adapter", adapter, "--output", tmp_path / "m"], "reward model"),
    ]
    for args, words in cases:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *map(str, args)],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
            timeout=120,
        )
        lines = proc.stderr.splitlines()
        assert proc.returncode == 1 and words in lines[-2] and lines[-1] == "False", (args, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.safetensors", "good.json", "good.safetensors"]
