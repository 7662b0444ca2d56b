"""A model is identified by what it is: the checkpoint fingerprint, and the artifact check built on it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from ster.engine.model.config import load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.resolve import EXAMPLES_DIR, resolve_model
from ster.engine.protocol.errors import Refusal

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPT = "question : tell me about the town . answer :"
TOY_PRINT = "22158bce652a"


def fingerprint(model: str | Path) -> str:
    source = resolve_model(str(model))
    return checkpoint_fingerprint(load_config(source.config), source.weights)


def rewrite_weights(directory: Path, change) -> None:
    """Load the directory's weights, let ``change`` edit the dict of tensors, and save them back."""
    from safetensors.torch import load_file, save_file

    state = load_file(directory / "model.safetensors")
    change(state)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})


def train(cli, model: str | Path, out: Path) -> dict:
    run = cli("train", "--model", model, "--pairs", PAIRS, "--output", out, "--layers", "1,2")
    assert run.code == 0, run.err
    return json.loads(out.read_text())


def generate(cli, model: str | Path, vector: Path):
    return cli("generate", "--model", model, "--prompt", PROMPT, "--vector", vector, "--strength", "3")


# --- the fingerprint ------------------------------------------------------------------------------


def test_the_toy_has_a_stable_fingerprint_that_ignores_where_it_lies(toy_copy: Path) -> None:
    print_ = fingerprint("ster:toy")
    assert print_.startswith(f"ster-fp1:{TOY_PRINT}") and len(print_) == len("ster-fp1:") + 64
    assert fingerprint(toy_copy) == fingerprint("ster:toy-chat") == print_  # a copy; the same weights, another template


def test_a_resharded_copy_has_the_same_fingerprint(toy_copy: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(toy_copy / "model.safetensors")
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, toy_copy / shard)
    (toy_copy / "model.safetensors").unlink()
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (toy_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    assert fingerprint(toy_copy) == fingerprint("ster:toy")


def scale_a_big_tensor(state: dict) -> None:
    state["model.layers.3.mlp.down_proj.weight"] = state["model.layers.3.mlp.down_proj.weight"] * 1.01


def change_one_value_of_a_small_tensor(state: dict) -> None:
    state["model.norm.weight"] = state["model.norm.weight"].clone()
    state["model.norm.weight"][63] = 0.5


def halve_the_dtype(state: dict) -> None:
    state.update({name: tensor.half() for name, tensor in state.items()})


def add_a_tensor(state: dict) -> None:
    state["extra.weight"] = state["model.norm.weight"].clone()


@pytest.mark.parametrize(
    "change", [scale_a_big_tensor, change_one_value_of_a_small_tensor, halve_the_dtype, add_a_tensor]
)
def test_changed_weights_change_the_fingerprint(toy_copy: Path, change) -> None:
    rewrite_weights(toy_copy, change)
    assert fingerprint(toy_copy) != fingerprint("ster:toy")


def test_the_architecture_counts_but_not_the_context_or_the_special_ids(toy_copy: Path) -> None:
    config_path = toy_copy / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "max_position_embeddings": 4096, "eos_token_id": 3}))
    assert fingerprint(toy_copy) == fingerprint("ster:toy")
    config_path.write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    assert fingerprint(toy_copy) != fingerprint("ster:toy")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: b"never read", "its header length is not that of a safetensors file"),
        (lambda data: struct.pack("<Q", 10**9) + data[8:], "its header length is not that of a safetensors file"),
        (lambda data: data[: len(data) // 2], "it ends before the tensor data its header names"),
    ],
)
def test_a_broken_weights_file_is_refused_at_open(cli, toy_copy: Path, damage, reason: str) -> None:
    weights = toy_copy / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(Refusal, match="could not be read"):
        fingerprint(toy_copy)
    run = cli("generate", "--model", toy_copy, "--prompt", PROMPT)
    assert run.code == 1
    assert run.err.strip().splitlines()[-1] == f"error: weights file {weights} could not be read: {reason}"
    assert "loading" not in run.err


# --- the artifact bound to it ---------------------------------------------------------------------


def test_two_spellings_of_one_directory_and_a_copy_are_the_same_model(
    cli, tmp_path: Path, toy_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact = train(cli, toy_copy, tmp_path / "calm.json")
    assert artifact["model"] == str(toy_copy) and artifact["model_fingerprint"].startswith(f"ster-fp1:{TOY_PRINT}")
    expected = generate(cli, toy_copy, tmp_path / "calm.json").json["text"]
    copy = tmp_path / "elsewhere" / "copied"
    shutil.copytree(toy_copy, copy)
    monkeypatch.chdir(tmp_path)
    for spelling in ["./toy-model", "toy-model/../toy-model/", str(copy), "ster:toy"]:
        run = generate(cli, spelling, tmp_path / "calm.json")
        assert run.code == 0, run.err
        assert run.json["text"] == expected
        assert (
            f'artifact was trained for model "{toy_copy}"; "{spelling}" has the same checkpoint fingerprint '
            f"({TOY_PRINT}), so it is the same model"
        ) in run.err.splitlines()


def test_a_changed_checkpoint_at_the_same_path_is_refused_before_the_weights_load(
    cli, tmp_path: Path, toy_copy: Path
) -> None:
    artifact = train(cli, toy_copy, tmp_path / "calm.json")
    rewrite_weights(toy_copy, lambda s: s.update({"lm_head.weight": s["lm_head.weight"] * 2}))
    now = fingerprint(toy_copy)
    for run in (
        generate(cli, toy_copy, tmp_path / "calm.json"),
        cli("evaluate", "--model", toy_copy, "--pairs", PAIRS, "--vector", tmp_path / "calm.json"),
    ):
        assert run.code == 1 and run.out == ""
        assert run.err.strip().splitlines()[-1] == (
            f'error: artifact was trained for model "{toy_copy}" with checkpoint fingerprint '
            f'{artifact["model_fingerprint"][9:21]}, but the checkpoint now at "{toy_copy}" has fingerprint '
            f"{now[9:21]}: its weights or architecture changed since the direction was fitted"
        )
        assert "loading" not in run.err


def test_another_checkpoint_under_another_name_is_refused_naming_both(cli, tmp_path: Path, toy_copy: Path) -> None:
    train(cli, "ster:toy", tmp_path / "calm.json")
    rewrite_weights(
        toy_copy,
        lambda s: s.update({"model.layers.0.self_attn.q_proj.weight": -s["model.layers.0.self_attn.q_proj.weight"]}),
    )
    run = generate(cli, toy_copy, tmp_path / "calm.json")
    assert run.code == 1 and run.err.strip().splitlines()[-1] == (
        f'error: artifact was trained for model "ster:toy", current model is "{toy_copy}", and their checkpoint '
        f"fingerprints differ too ({TOY_PRINT} and {fingerprint(toy_copy)[9:21]})"
    )


def test_an_artifact_without_a_fingerprint_is_matched_by_name(cli, tmp_path: Path, toy_copy: Path) -> None:
    artifact = train(cli, "ster:toy", tmp_path / "calm.json")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in artifact.items() if k != "model_fingerprint"}))
    assert generate(cli, "ster:toy", old).code == 0
    run = generate(cli, toy_copy, old)
    assert run.code == 1 and run.err.strip().splitlines()[-1] == (
        f'error: artifact was trained for model "ster:toy", current model is "{toy_copy}"'
    )


@pytest.mark.real
def test_smollm2_is_itself_under_any_spelling_and_not_the_toy(
    cli, tmp_path: Path, smol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calm = tmp_path / "calm.json"
    run = cli("train", "--model", smol, "--pairs", PAIRS, "--output", calm, "--layers", "12")
    assert run.code == 0, run.err
    monkeypatch.chdir(smol.parent)
    relative = f"./{smol.name}"
    steered = cli(
        "generate", "--model", relative, "--prompt", "Tell me about the sea.", "--vector", calm, "--max-new-tokens", "4"
    )
    assert steered.code == 0, steered.err
    assert f'"{relative}" has the same checkpoint fingerprint' in steered.err
    toy = tmp_path / "toy.json"
    train(cli, "ster:toy", toy)
    for model, vector, other in ((smol, toy, "ster:toy"), ("ster:toy", calm, str(smol))):
        refused = cli("generate", "--model", model, "--prompt", PROMPT, "--vector", vector)
        assert refused.code == 1 and "and their checkpoint fingerprints differ too" in refused.err
        assert f'artifact was trained for model "{other}"' in refused.err and "loading" not in refused.err
