"""``tune merge``: an adapter folded into an ordinary checkpoint directory that reads like the adapter applied.

The adapter comes from a real ``tune sft`` run at a high learning rate on answers the toy
does not give, so that it changes the greedy text; the merged directory must then generate
exactly what ``generate --adapter`` does, with logits equal to 1e-5.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ster.cli import main
from ster.engine.model.adapters.lora import attached, load_adapter
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.tune.merge import weight_name
from tests.tune.adapter_files import PROMPT, header, write_adapter

SWAPPED = {
    "name": "swapped",
    "examples": [
        {"prompt": "question : how many legs does a cat have ? answer :", "completion": "a cat has eight legs ."},
        {"prompt": "question : how many legs does a dog have ? answer :", "completion": "a dog has eight legs ."},
        {"prompt": "question : what color is the sky ? answer :", "completion": "the sky is red ."},
    ],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SFT adapter that moves the toy's greedy answers."""
    where = tmp_path_factory.mktemp("sft")
    (where / "examples.json").write_text(json.dumps(SWAPPED))
    adapter = where / "swapped.safetensors"
    code = main(
        [
            "tune",
            "sft",
            "--model",
            "ster:toy",
            "--examples",
            str(where / "examples.json"),
            "--output",
            str(adapter),
            "--learning-rate",
            "0.05",
            "--epochs",
            "2",
            "--accumulation",
            "1",
            "--targets",
            "query,value,down",
            "--layers",
            "1..4",
        ]
    )
    assert code == 0
    return adapter


def greedy(cli, *args: str) -> str:
    run = cli("generate", "--prompt", PROMPT, "--max-new-tokens", "8", *args)
    assert run.code == 0, run.err
    return run.json["text"]


def test_the_merged_checkpoint_generates_what_the_adapter_does(cli, tmp_path: Path, trained: Path) -> None:
    merged = tmp_path / "merged"
    run = cli("tune", "merge", "--model", "ster:toy", "--adapter", trained, "--output", merged)
    assert run.code == 0, run.err
    report = run.json["report"]
    assert list(report) == [
        "model",
        "model_revision",
        "adapter",
        "output",
        "rank",
        "alpha",
        "scale",
        "targets",
        "layers",
        "hidden_size",
        "merged_tensors",
        "copied_tensors",
        "total_tensors",
        "parameters",
        "dtype",
        "files",
    ]
    assert (report["merged_tensors"], report["total_tensors"], report["scale"]) == (9, 39, 2.0)
    assert report["copied_tensors"] == 30 and report["dtype"] == "F32" and report["layers"] == [1, 2, 3]
    assert report["files"] == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in merged.iterdir()) == report["files"]
    adapted = greedy(cli, "--model", "ster:toy", "--adapter", trained)
    assert adapted != greedy(cli, "--model", "ster:toy")  # the adapter does change the text
    assert greedy(cli, "--model", merged) == adapted


def test_merged_logits_equal_the_adapted_models(tmp_path: Path, trained: Path) -> None:
    merged = tmp_path / "merged"
    assert main(["tune", "merge", "--model", "ster:toy", "--adapter", str(trained), "--output", str(merged)]) == 0
    cpu = torch.device("cpu")
    base_source, merged_source = resolve_model("ster:toy"), resolve_model(str(merged))
    config = load_config(base_source.config)
    base, folded = load_decoder(base_source, config, "f32", cpu), load_decoder(merged_source, config, "f32", cpu)
    _, adapter = load_adapter(trained, config, cpu)
    ids = torch.tensor([[1, 10, 20, 30, 40, 50, 60, 70]])
    with torch.inference_mode():
        with attached(base, adapter):
            through = base(ids, vocab="all").logits
        plain = base(ids, vocab="all").logits
        direct = folded(ids, vocab="all").logits
    assert (through - plain).abs().max() > 1e-2
    assert (direct - through).abs().max() < 1e-5


def test_the_update_is_accumulated_in_f32_and_cast_back(cli, tmp_path: Path) -> None:
    half = tmp_path / "toy-bf16"
    shutil.copytree(TOY_DIR, half)
    state = load_file(str(half / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(half / "model.safetensors"))
    adapter_path = tmp_path / "a.safetensors"
    adapter = write_adapter(adapter_path, model=str(half), b_scale=0.2, targets=("key", "gate"), layers=(2,))
    run = cli("tune", "merge", "--model", half, "--adapter", adapter_path, "--output", tmp_path / "merged")
    assert run.code == 0, run.err
    assert run.json["report"]["dtype"] == "BF16"
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    source = load_file(str(half / "model.safetensors"))
    for target in ("key", "gate"):
        name = weight_name(2, target)
        a, b = adapter.tensors[f"layers.2.{target}.a"], adapter.tensors[f"layers.2.{target}.b"]
        expected = (source[name].float() + adapter.scale * (b @ a)).to(torch.bfloat16)
        assert merged[name].dtype == torch.bfloat16 and torch.equal(merged[name], expected)
    untouched = [n for n in source if n not in (weight_name(2, "key"), weight_name(2, "gate"))]
    assert all(torch.equal(merged[n], source[n]) for n in untouched)


def test_the_chat_template_travels_with_the_merged_checkpoint(cli, tmp_path: Path) -> None:
    adapter = tmp_path / "chat.safetensors"
    write_adapter(adapter, model="ster:toy-chat", b_scale=0.1)
    run = cli("tune", "merge", "--model", "ster:toy-chat", "--adapter", adapter, "--output", tmp_path / "merged")
    assert run.code == 0, run.err
    assert "chat_template" in json.loads((tmp_path / "merged" / "tokenizer_config.json").read_text())
    again = cli("generate", "--model", tmp_path / "merged", "--prompt", "hello", "--max-new-tokens", "2")
    assert again.json["chat_template"] == "applied"


def _sharded_twice(tmp_path: Path) -> Path:
    """A toy copy in two shards that both hold the embedding."""
    sharded = tmp_path / "sharded"
    shutil.copytree(TOY_DIR, sharded)
    state = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: state[n] for n in first}, str(sharded / "model-00001-of-00002.safetensors"))
    save_file(
        {n: state[n] for n in [*second, "model.embed_tokens.weight"]}, str(sharded / "model-00002-of-00002.safetensors")
    )
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sharded


def test_refusals_write_nothing(cli, tmp_path: Path, trained: Path) -> None:
    reward = tmp_path / "judge.safetensors"
    write_adapter(reward, kind="reward")
    wide = tmp_path / "wide.safetensors"
    write_adapter(wide)
    side = json.loads(wide.with_suffix(".json").read_text())
    wide.with_suffix(".json").write_text(json.dumps({**side, "hidden_size": 32}))
    sharded = _sharded_twice(tmp_path)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    cases = [
        ("ster:toy", reward, out, "adapter artifact is a reward model, not a generation adapter"),
        ("ster:toy", wide, out, "adapter width 32 does not match model width 64"),
        (
            "ster:toy-chat",
            tmp_path / "nope.safetensors",
            out,
            f"failed to read adapter {tmp_path / 'nope.safetensors'}: it does not exist",
        ),
        (
            str(sharded),
            trained,
            out,
            (
                "tensor model.embed_tokens.weight is in both model-00001-of-00002.safetensors "
                "and model-00002-of-00002.safetensors; a checkpoint names each tensor once, so "
                "this one is refused rather than half-merged"
            ),
        ),
        (str(tmp_path / "no-model"), trained, out, f"model directory {tmp_path / 'no-model'} does not exist"),
        (
            "ster:toy",
            trained,
            occupied,
            f"output directory {occupied} already exists and is not empty (it is a directory); choose a new path",
        ),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for model, adapter, output, sentence in cases:
        run = cli("tune", "merge", "--model", model, "--adapter", adapter, "--output", output)
        assert (run.code, run.out, run.err.splitlines()[-1]) == (1, "", f"error: {sentence}"), run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]


def test_a_sidecar_for_another_model_is_refused(cli, tmp_path: Path, trained: Path) -> None:
    other = tmp_path / "other.safetensors"
    shutil.copy(trained, other)
    side = json.loads(trained.with_suffix(".json").read_text())
    other.with_suffix(".json").write_text(
        json.dumps({**side, "model": "HuggingFaceTB/SmolLM2-135M", "model_fingerprint": "ster-fp1:" + "1" * 64})
    )
    run = cli("tune", "merge", "--model", "ster:toy", "--adapter", other, "--output", tmp_path / "m")
    assert run.err.splitlines()[-1] == (
        'error: adapter was trained for model "HuggingFaceTB/SmolLM2-135M", current model is "ster:toy"'
    )
    assert header(trained)  # the trained adapter is untouched
