"""``tune inspect``: the sidecar with every tensor's name and shape, without a model and without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from ster.engine.model.adapters.artifact import sidecar_path
from tests.conftest import REPO
from tests.tune.adapter_files import rewrite_tensors, write_adapter

KEYS = [
    "schema_version",
    "product",
    "kind",
    "model",
    "model_revision",
    "model_fingerprint",
    "rank",
    "alpha",
    "scale",
    "targets",
    "layers",
    "hidden_size",
    "tensors",
    "train",
]


def test_inspect_lists_every_tensor_without_torch(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(
        path,
        rank=4,
        alpha=6.0,
        targets=("value", "output", "down"),
        layers=(0, 3),
        train={"chat_template": "absent", "precision": "f32"},
    )
    code = (
        "import sys; from ster.cli import main; code = main(['tune', 'inspect', sys.argv[1]]); "
        "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0 and proc.stderr.splitlines()[-1] == "False", proc.stderr
    document = json.loads(proc.stdout)
    assert list(document) == ["adapter"]
    adapter = document["adapter"]
    assert list(adapter) == KEYS
    assert (adapter["kind"], adapter["rank"], adapter["alpha"], adapter["scale"]) == ("adapter", 4, 6.0, 1.5)
    assert adapter["train"] == {"chat_template": "absent", "precision": "f32"}
    shapes = {"value": ([4, 64], [32, 4]), "output": ([4, 64], [64, 4]), "down": ([4, 160], [64, 4])}
    assert adapter["tensors"] == [
        {"name": f"layers.{layer}.{target}.{side}", "shape": shapes[target][i], "dtype": "F32"}
        for layer in (0, 3)
        for target in ("value", "output", "down")
        for i, side in enumerate("ab")
    ]


def test_a_reward_model_shows_its_head(cli, tmp_path: Path) -> None:
    path = tmp_path / "judge.safetensors"
    write_adapter(path, kind="reward", targets=("query",), layers=(1,))
    run = cli("tune", "inspect", path)
    assert run.code == 0, run.err
    assert run.json["adapter"]["kind"] == "reward"
    assert run.json["adapter"]["tensors"][-1] == {"name": "reward.head", "shape": [1, 64], "dtype": "F32"}


def test_inspect_refuses_what_a_loader_refuses(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, rank=4)
    rewrite_tensors(path, lambda t: {**t, "layers.0.query.a": torch.zeros(4, 65)})
    run = cli("tune", "inspect", path)
    assert run.err.splitlines()[-1] == "error: adapter tensor layers.0.query.a has 65 columns, expected 64"
    rewrite_tensors(path, lambda t: {**t, "layers.0.query.a": torch.zeros(4, 64), "layers.9.query.a": torch.zeros(1)})
    run = cli("tune", "inspect", path)
    assert run.err.splitlines()[-1] == (
        f"error: adapter artifact {path} holds tensor layers.9.query.a, which its sidecar does not declare"
    )
    run = cli("tune", "inspect", sidecar_path(path))
    assert run.err.splitlines()[-1] == (
        f"error: {sidecar_path(path)} is an adapter's sidecar; give the adapter file beside it, {path}"
    )
    run = cli("tune", "inspect", tmp_path)
    assert run.code == 1 and run.err.splitlines()[-1] == (
        f"error: directory {tmp_path} has no adapter_config.json, so it is not a PEFT adapter directory"
    )


def test_a_peft_directory_reads_as_the_adapter_it_applies_as(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, rank=4, alpha=6.0, targets=("query", "down"), layers=(1,))
    assert cli("tune", "export-peft", path, "--output", tmp_path / "peft").code == 0
    run = cli("tune", "inspect", tmp_path / "peft")
    assert run.code == 0, run.err
    adapter = run.json["adapter"]
    assert list(adapter) == KEYS
    assert (adapter["product"], adapter["kind"], adapter["rank"], adapter["alpha"], adapter["scale"]) == (
        "peft",
        "adapter",
        4,
        6.0,
        1.5,
    )
    assert (adapter["targets"], adapter["layers"], adapter["hidden_size"], adapter["train"]) == (
        ["query", "down"],
        [1],
        64,
        None,
    )
    assert adapter["tensors"] == [
        {"name": "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", "shape": [4, 64], "dtype": "F32"},
        {"name": "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight", "shape": [64, 4], "dtype": "F32"},
        {"name": "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", "shape": [4, 160], "dtype": "F32"},
        {"name": "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", "shape": [64, 4], "dtype": "F32"},
    ]
