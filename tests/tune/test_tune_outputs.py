"""What a command may write over: a tune output replaces only an older adapter, and no output lands inside the
checkpoint it reads.

Each case puts something a user would lose at the output path (a model's weights, a pair set, a steering
artifact, a file of notes, a directory) and checks the one sentence, exit 1, and that every byte is still there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import build_job_request
from tests.tune.adapter_files import write_adapter

SFT = ("tune", "sft", "--examples", "ster:examples", "--accumulation", "1")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (or ``root`` itself) with its bytes: what must survive a refusal."""
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(run, *words: str) -> str:
    """Exit 1, one sentence last, and no weight read before it (the check needs the config at most)."""
    assert run.code == 1, run.err
    line = run.err.strip().splitlines()[-1]
    assert line.startswith("error: "), run.err
    for word in words:
        assert word in line, line
    assert "Traceback" not in run.err and "weights at" not in run.err
    return line


@pytest.fixture
def artifact(tmp_path: Path, cli) -> Path:
    path = tmp_path / "calm.json"
    assert cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", path, "--layers", "1").code == 0
    return path


@pytest.mark.parametrize("holds", ["notes", "pair set", "steering artifact", "weights"])
def test_a_tune_output_never_replaces_what_is_not_an_adapter(
    cli, tmp_path: Path, artifact: Path, toy_copy: Path, holds: str
) -> None:
    out = tmp_path / "out.safetensors"
    if holds == "notes":
        out.write_text("my notes\n")
    elif holds == "pair set":
        shutil.copy(EXAMPLES_DIR / "pairs.json", out)
    elif holds == "steering artifact":
        shutil.copy(artifact, out)
    else:  # another model's weights: a safetensors file with no adapter sidecar beside it
        shutil.copy(toy_copy / "model.safetensors", out)
    before = out.read_bytes()
    line = refused(cli(*SFT, "--model", "ster:toy", "--output", out), f"--output {out} already holds")
    assert {
        "notes": "not a Ster document",
        "pair set": "a pair set",
        "steering artifact": "a steering artifact",
        "weights": "a safetensors file that is not a LoRA adapter",
    }[holds] in line
    assert out.read_bytes() == before and not out.with_suffix(".json").exists()


def test_a_suffixless_output_over_a_pair_set_is_refused(cli, tmp_path: Path) -> None:
    """``--output calm`` (a pair set saved without a suffix) has the free sidecar path calm.json."""
    out = tmp_path / "calm"
    shutil.copy(EXAMPLES_DIR / "pairs.json", out)
    before = snapshot(tmp_path)
    refused(cli(*SFT, "--model", "ster:toy", "--output", out), "already holds a pair set")
    assert snapshot(tmp_path) == before


def test_the_sidecar_path_holds_nothing_or_an_adapter_sidecar(cli, tmp_path: Path, artifact: Path) -> None:
    out = tmp_path / "calm.safetensors"  # its sidecar would be calm.json: the steering artifact
    before = artifact.read_bytes()
    refused(
        cli(*SFT, "--model", "ster:toy", "--output", out),
        f"the adapter's sidecar {artifact} already holds a steering artifact",
    )
    assert artifact.read_bytes() == before and not out.exists()


def test_the_base_models_weights_are_never_an_output(cli, toy_copy: Path) -> None:
    before = snapshot(toy_copy)
    for out in (toy_copy / "model.safetensors", toy_copy / "sub" / "new.safetensors", toy_copy / "tokenizer"):
        line = refused(cli(*SFT, "--model", toy_copy, "--output", out), f"--output {out} is inside {toy_copy}")
        assert line.endswith("so writing it could destroy the model; give --output a path outside it")
    assert snapshot(toy_copy) == before


def test_a_symlink_into_the_model_is_inside_it(cli, tmp_path: Path, toy_copy: Path) -> None:
    link = tmp_path / "weights.safetensors"
    link.symlink_to(toy_copy / "model.safetensors")
    before = snapshot(toy_copy)
    refused(cli(*SFT, "--model", toy_copy, "--output", link), "is inside")
    assert snapshot(toy_copy) == before


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--pairs", "ster:pairs", "--output", "{model}/calm.json"],
        ["optimize", "--pairs", "ster:pairs", "--output", "{model}/calm.json"],
        ["extract", "--input", "ster:prompts", "--output", "{model}/states.json"],
        ["tune", "dpo", "--pairs", "ster:pairs", "--output", "{model}/model.safetensors"],
        ["tune", "reward", "--pairs", "ster:pairs", "--output", "{model}/r.safetensors"],
        ["tune", "grpo", "--prompts", "ster:grpo-prompts", "--output", "{model}/g.safetensors"],
        ["tune", "merge", "--adapter", "{tmp}/a.safetensors", "--output", "{model}/merged"],
        ["pairs", "synthesize", "--trait", "calm", "--count", "1", "--output", "{model}/p.json"],
    ],
)
def test_no_command_writes_inside_the_model_it_reads(cli, tmp_path: Path, toy_copy: Path, command: list[str]) -> None:
    write_adapter(tmp_path / "a.safetensors")
    before = snapshot(toy_copy)
    args = [a.replace("{model}", str(toy_copy)).replace("{tmp}", str(tmp_path)) for a in command]
    refused(cli(*args, "--model", toy_copy), "is inside", "the checkpoint --model")
    assert snapshot(toy_copy) == before


def test_a_hub_models_cache_folder_is_inside_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked from the request alone as the job starts: no network, no download."""
    from ster.engine.protocol.requests import check_before_running

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = tmp_path / "models--org--name" / "snapshots" / "abc" / "model.safetensors"
    request = build_job_request("tune sft", model="org/name", examples="ster:examples", output=str(out))
    with pytest.raises(Refusal, match="is inside .*models--org--name, the checkpoint --model org/name reads"):
        check_before_running(request)
    check_before_running(
        build_job_request(
            "tune sft", model="org/name", examples="ster:examples", output=str(tmp_path / "a.safetensors")
        )
    )


@pytest.mark.parametrize("spelling", ["newdir/", "newdir/."])
def test_an_output_spelled_as_a_directory_is_refused(
    cli, tmp_path: Path, spelling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    refused(
        cli(*SFT, "--model", "ster:toy", "--output", spelling), f"--output {spelling} ends in /", "takes a file path"
    )
    refused(cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", spelling), "ends in /")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_not_a_file_output(cli, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    refused(cli(*SFT, "--model", "ster:toy", "--output", tmp_path / "d"), "is an empty directory, not a regular file")
    assert list((tmp_path / "d").iterdir()) == []


def test_an_older_adapter_is_replaced_and_said_so(cli, tmp_path: Path) -> None:
    out = tmp_path / "calm.safetensors"
    write_adapter(out, rank=2)
    run = cli("--json", *SFT, "--model", "ster:toy", "--output", out, "--rank", "4")
    assert run.code == 0, run.err
    logs = [e["message"] for e in run.events if e["type"] == "log"]
    assert f"replacing the LoRA adapter at {out}" in logs
    assert f"replacing the LoRA adapter sidecar at {out.with_suffix('.json')}" in logs
    assert json.loads(out.with_suffix(".json").read_text())["rank"] == 4


@pytest.mark.parametrize(
    "job",
    [
        ["tune", "merge", "--model", "ster:toy", "--adapter", "{a}"],
        ["tune", "export-peft", "{a}"],
        ["model", "import", "{tmp}/m.gguf"],
    ],
)
@pytest.mark.parametrize("holds", ["file", "empty file", "fifo", "full directory"])
def test_a_directory_output_replaces_nothing(cli, tmp_path: Path, job: list[str], holds: str) -> None:
    adapter = tmp_path / "a.safetensors"
    write_adapter(adapter)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    out = tmp_path / "out"
    if holds == "file":
        out.write_text("my notes\n")
    elif holds == "empty file":
        out.write_text("")
    elif holds == "fifo":
        os.mkfifo(out)
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine\n")
    before = snapshot(out) if holds != "fifo" else None
    args = [a.replace("{a}", str(adapter)).replace("{tmp}", str(tmp_path)) for a in job]
    line = refused(cli(*args, "--output", out), f"{out}")
    assert ("already exists and is not empty" if holds == "full directory" else "not a directory") in line
    if before is not None:
        assert snapshot(out) == before
    if holds == "fifo":
        assert out.is_fifo()


def test_a_directory_output_may_end_in_a_slash(tmp_path: Path) -> None:
    write_adapter(tmp_path / "a.safetensors")
    request = build_job_request("tune export-peft", adapter=str(tmp_path / "a.safetensors"), output=f"{tmp_path}/peft/")
    assert request.output == tmp_path / "peft"
