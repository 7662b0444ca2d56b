"""Every reader of an adapter checks the file wholly, and a pair from two writes is refused.

Attacked as damage or a crash would: the tensors of one write beside the sidecar of another, a
file cut in half, bytes after the last tensor, a header whose offsets lie, values that are
finite but overflow f32 once applied, and sidecar fields no adapter has. Every reader — ``tune
inspect``, ``generate``, ``tune evaluate``, ``tune merge``, ``tune export-peft`` and ``tune grpo
--reward`` — refuses in one sentence with exit 1, prints nothing on stdout and writes nothing.
An adapter written before the sidecar recorded the hash is still read (every other check applies).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from ster.engine.model.adapters.artifact import sidecar_path
from ster.engine.protocol.errors import Refusal
from tests.tune.adapter_files import PROMPT, edit_sidecar, record_hash, rewrite_tensors, write_adapter


def readers(adapter: Path, tmp_path: Path) -> dict[str, list[Any]]:
    """Every command that reads a generation adapter, as arguments."""
    return {
        "inspect": ["tune", "inspect", adapter],
        "generate": [
            "generate",
            "--model",
            "ster:toy",
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "2",
            "--adapter",
            adapter,
        ],
        "evaluate": ["tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples", "--adapter", adapter],
        "merge": ["tune", "merge", "--model", "ster:toy", "--adapter", adapter, "--output", tmp_path / "merged"],
        "export-peft": ["tune", "export-peft", adapter, "--output", tmp_path / "peft"],
    }


def refused_by_every_reader(cli, adapter: Path, tmp_path: Path, sentence: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, args in readers(adapter, tmp_path).items():
        run = cli(*args)
        assert (run.code, run.out) == (1, ""), (name, run.err)
        assert "Traceback" not in run.err, (name, run.err)
        assert run.err.splitlines()[-1].startswith("error: " + sentence), (name, run.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two adapters of the same shapes from two writes (another seed), each with its own sidecar."""
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_adapter(first, b_scale=0.1, seed=0)
    write_adapter(second, b_scale=0.1, seed=1)
    return first, second


def _two_writes(adapter: Path) -> str:
    return f"adapter {adapter} and its sidecar {sidecar_path(adapter)} are from two different writes"


def test_new_tensors_beside_an_old_sidecar_are_refused_by_every_reader(
    cli, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    first, second = pair
    shutil.copyfile(second, first)  # what a kill between the two renames of an older writer left
    refused_by_every_reader(cli, first, tmp_path, _two_writes(first))


def test_a_new_sidecar_beside_old_tensors_is_refused(cli, pair: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = pair
    shutil.copyfile(sidecar_path(second), sidecar_path(first))  # what a kill between Ster's two renames leaves
    refused_by_every_reader(cli, first, tmp_path, _two_writes(first))


def test_a_reward_model_from_two_writes_is_refused_by_grpo(cli, tmp_path: Path) -> None:
    judge, other = tmp_path / "judge.safetensors", tmp_path / "other.safetensors"
    write_adapter(judge, kind="reward", head_scale=1.0, seed=0)
    write_adapter(other, kind="reward", head_scale=1.0, seed=1)
    shutil.copyfile(other, judge)
    run = cli(
        "tune",
        "grpo",
        "--model",
        "ster:toy",
        "--prompts",
        "ster:grpo-prompts",
        "--max-new-tokens",
        "4",
        "--reward",
        judge,
        "--output",
        tmp_path / "policy.safetensors",
    )
    assert run.code == 1 and run.err.splitlines()[-1].startswith("error: " + _two_writes(judge)), run.err
    assert not (tmp_path / "policy.safetensors").exists()


def test_a_pair_written_by_ster_records_the_hash_of_its_tensors(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    recorded = json.loads(sidecar_path(path).read_text())["tensors_sha256"]
    assert recorded == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_adapter_from_before_the_hash_is_still_read(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    document = json.loads(sidecar_path(path).read_text())
    del document["tensors_sha256"]
    sidecar_path(path).write_text(json.dumps(document))
    assert cli("tune", "inspect", path).code == 0
    assert cli(*readers(path, tmp_path)["generate"]).code == 0


# --- the file against its own header ----------------------------------------------------------------------


def test_an_adapter_cut_in_half_is_refused_by_every_reader(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    refused_by_every_reader(
        cli, path, tmp_path, f"failed to read adapter {path}: it is truncated (its header describes"
    )


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _rewritten(path: Path, header: dict[str, Any], body: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)
    record_hash(path)  # one defect at a time


@pytest.mark.parametrize(
    ("damage", "phrase"),
    [
        (lambda header, body: (header, body + b"\0" * 16), "holds 16 bytes after its last tensor"),
        (
            lambda header, body: ({**header, "layers.0.query.a": {**header["layers.0.query.a"], "dtype": "I32"}}, body),
            "adapter tensor layers.0.query.a is stored as I32, not as floating-point numbers",
        ),
        (
            lambda header, body: (
                {**header, "layers.0.query.a": {**header["layers.0.query.a"], "shape": [4, 32]}},
                body,
            ),
            "gives tensor layers.0.query.a 1024 bytes where its shape [4, 32] of F32 takes 512",
        ),
        (
            lambda header, body: ({**header, "layers.0.query.a": {**header["layers.0.query.a"], "dtype": "F99"}}, body),
            "names dtype 'F99' for tensor layers.0.query.a, which is not a safetensors dtype",
        ),
    ],
)
def test_a_header_that_does_not_describe_its_data_is_refused(cli, tmp_path: Path, damage, phrase: str) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    _rewritten(path, *damage(*_header(path)))
    run = cli("tune", "inspect", path)
    assert run.code == 1 and phrase in run.err.splitlines()[-1] and "Traceback" not in run.err, run.err


# --- values that would overflow once applied --------------------------------------------------------------


def _pre_hash(path: Path) -> None:
    """Drop the hash from the sidecar: the file reads as one written before the hash, so only the values judge it."""
    document = json.loads(sidecar_path(path).read_text())
    document.pop("tensors_sha256", None)
    sidecar_path(path).write_text(json.dumps(document))


def _filled(name: str, value: float):
    return lambda tensors: {**tensors, name: torch.full_like(tensors[name], value)}


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (
            _filled("layers.0.query.b", 3e38),
            ("adapter tensors layers.0.query.a and layers.0.query.b can make an update as large as"),
        ),
        (_filled("layers.0.query.a", 3e38), "adapter tensor layers.0.query.a holds 3e+38, beyond 1e+24"),
        (_filled("layers.2.value.b", float("inf")), "adapter tensor layers.2.value.b contains a non-finite value"),
    ],
)
def test_values_that_overflow_once_applied_are_refused_by_every_reader(
    cli, tmp_path: Path, change, phrase: str
) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    rewrite_tensors(path, change)
    _pre_hash(path)
    refused_by_every_reader(cli, path, tmp_path, phrase)


def test_an_alpha_that_overflows_f32_is_refused(cli, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.0)  # a fresh adapter: B is zero, so only the scale can overflow
    edit_sidecar(path, alpha=1e300)
    run = cli("tune", "inspect", path)
    assert run.code == 1 and "are applied at alpha / rank 2.5e+299, beyond 1e+24" in run.err, run.err


def test_the_writer_refuses_what_a_reader_would(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    with pytest.raises(Refusal, match=r"holds 3e\+30, beyond 1e\+24, .*, so the adapter is not written$"):
        from ster.engine.model.adapters.artifact import AdapterSidecar
        from ster.engine.model.adapters.lora import save_adapter
        from tests.tune.adapter_files import toy_config

        config, _ = toy_config()
        adapter = write_adapter(tmp_path / "good.safetensors")
        adapter.tensors["layers.0.query.a"].data.fill_(3e30)
        sidecar = AdapterSidecar(
            model="ster:toy", rank=4, alpha=8.0, targets=["query", "value"], layers=[0, 1, 2, 3], hidden_size=64
        )
        save_adapter(path, sidecar, adapter, config)
    assert not path.exists() and not sidecar_path(path).exists()


# --- the sidecar's own fields ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "phrase"),
    [
        ({"rank": -1}, "adapter rank -1 trains nothing"),
        ({"rank": 2**40}, f"gives rank {2**40}, outside 1 to"),
        ({"rank": "4"}, "rank: Input should be a valid integer"),
        ({"rank": True}, "rank: Input should be a valid integer"),
        ({"alpha": float("nan")}, "adapter alpha nan is not a positive finite number"),
        ({"alpha": 0}, "adapter alpha 0.0 is not a positive finite number"),
        ({"layers": [-1]}, "lists layer -1, which no model has"),
        ({"layers": [10**30]}, f"lists layer {10**30}, which no model has"),
        ({"layers": [0, 0, 1, 2, 3]}, "lists layer 0 twice"),
        ({"layers": []}, "lists no layers, so the adapter changes nothing"),
        ({"targets": ["query", "query"]}, "names target query twice"),
        ({"targets": ["query", "nose"]}, 'unknown adapter target "nose"'),
        ({"hidden_size": 0}, "gives hidden_size 0, outside 1 to"),
        ({"tensors_sha256": "not a hash"}, "gives tensors_sha256 'not a hash', which is not a SHA-256 in hex"),
    ],
)
def test_a_sidecar_field_no_adapter_has_is_refused(cli, tmp_path: Path, changes: dict[str, Any], phrase: str) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    edit_sidecar(path, **changes)
    run = cli("tune", "inspect", path)
    assert run.code == 1 and phrase in run.err.splitlines()[-1] and "Traceback" not in run.err, run.err


# --- PEFT directories --------------------------------------------------------------------------------------


@pytest.fixture
def peft_dir(cli, tmp_path: Path) -> Path:
    path = tmp_path / "a.safetensors"
    write_adapter(path, b_scale=0.1)
    assert cli("tune", "export-peft", path, "--output", tmp_path / "peft").code == 0
    return tmp_path / "peft"


def _peft_readers(peft: Path, tmp_path: Path) -> list[list[Any]]:
    return [
        ["tune", "inspect", peft],
        ["tune", "evaluate", "--model", "ster:toy", "--examples", "ster:examples", "--adapter", peft],
        ["tune", "merge", "--model", "ster:toy", "--adapter", peft, "--output", tmp_path / "merged"],
    ]


def test_a_peft_directory_with_its_weights_cut_in_half_is_refused(cli, peft_dir: Path, tmp_path: Path) -> None:
    weights = peft_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for args in _peft_readers(peft_dir, tmp_path):
        run = cli(*args)
        assert run.code == 1 and "is truncated (its header describes" in run.err.splitlines()[-1], (args, run.err)
    assert not (tmp_path / "merged").exists()


def test_a_peft_factor_that_overflows_once_applied_is_refused(cli, peft_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = peft_dir / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in tensors if n.endswith("lora_A.weight"))
    save_file({**tensors, name: torch.full_like(tensors[name], 3e38)}, str(weights))
    for args in _peft_readers(peft_dir, tmp_path):
        run = cli(*args)
        assert run.code == 1 and f"PEFT adapter tensor {name} holds 3e+38, beyond 1e+24" in run.err, (args, run.err)
        assert "Traceback" not in run.err
