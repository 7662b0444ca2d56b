"""Hub ids resolve through the standard Hugging Face cache, offline, against a cache the test builds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ster.engine.model.resolve import TOY_DIR
from tests.conftest import run_subprocess

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_cache(hub: Path, repo: str = "acme/toy-llama") -> Path:
    """Lay out a repository in the cache exactly as huggingface_hub stores a download."""
    root = hub / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(TOY_DIR, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def generate(model: str, env: dict[str, str], *extra: str):
    return run_subprocess(
        "generate", "--model", model, "--prompt", "the sea is", "--max-new-tokens", "3", *extra, env=env
    )


def test_a_hub_id_resolves_from_hf_hub_cache_offline(tmp_path: Path) -> None:
    build_cache(tmp_path / "hub")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    run = generate("acme/toy-llama", env)
    assert run.code == 0, run.err
    assert run.json["model"] == "acme/toy-llama" and run.json["model_revision"] == COMMIT
    pinned = generate("acme/toy-llama", env, "--revision", COMMIT)
    assert pinned.code == 0 and pinned.json["model_revision"] == COMMIT
    assert pinned.json["text"] == run.json["text"]


def test_hf_home_moves_the_cache(tmp_path: Path) -> None:
    build_cache(tmp_path / "home" / "hub")
    run = generate("acme/toy-llama", {"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"})
    assert run.code == 0, run.err
    assert run.json["model_revision"] == COMMIT


def test_an_uncached_id_offline_is_refused_in_one_sentence(tmp_path: Path) -> None:
    build_cache(tmp_path / "hub")
    run = generate("acme/other-model", {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert run.code == 1
    assert run.err.strip().splitlines()[-1] == (
        f"error: model acme/other-model is not a local directory and is not in the Hugging Face cache at "
        f"{tmp_path / 'hub'}, and HF_HUB_OFFLINE forbids downloading it"
    )


def test_an_unreachable_endpoint_is_refused_without_a_traceback(tmp_path: Path) -> None:
    run = generate(
        "acme/other-model",
        {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert run.code == 1 and "Traceback" not in run.err
    assert "http://127.0.0.1:9 could not be reached" in run.err


def test_a_cached_repository_of_another_family_is_refused(tmp_path: Path) -> None:
    snapshot = build_cache(tmp_path / "hub")
    config = snapshot / "config.json"
    config.write_text(config.read_text().replace('"llama"', '"t5"'))
    run = generate("acme/toy-llama", {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"})
    assert run.code == 1 and 'model_type "t5", which is not a causal language model' in run.err


@pytest.mark.parametrize("local", ["copy", "ster:toy"])
def test_revision_with_a_local_checkpoint_is_recorded_with_a_warning(cli, toy_copy: Path, local: str) -> None:
    model = str(toy_copy) if local == "copy" else local
    what = "a local directory" if local == "copy" else "the bundled toy checkpoint"
    run = cli(
        "--json", "generate", "--model", model, "--prompt", "the sea is", "--max-new-tokens", "2", "--revision", "v1.0"
    )
    assert run.code == 0, run.out
    warning = f"--revision v1.0 is recorded as model_revision but not checked: {model} is {what}, not a Hub repository"
    assert {"type": "warning", "message": warning} in run.events
    assert run.events[-1]["data"]["model_revision"] == "v1.0"
