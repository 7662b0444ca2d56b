"""``ster model import`` refusals, on GGUF files the tests write themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")


def write_gguf(path: Path, architecture: str) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_non_llama_gguf_is_refused_before_anything_is_written(cli, tmp_path: Path) -> None:
    source = write_gguf(tmp_path / "gpt2.gguf", "gpt2")
    out = tmp_path / "out"
    run = cli("model", "import", source, "--output", out)
    assert run.code == 1
    assert f'{source} declares model_type "gpt2", which Ster cannot load; supported model types: "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3"' in run.err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.gguf"]


def test_a_file_that_is_not_gguf_is_refused(cli, tmp_path: Path) -> None:
    source = tmp_path / "fake.gguf"
    source.write_bytes(b"definitely not a gguf file")
    run = cli("model", "import", source, "--output", tmp_path / "out")
    assert run.code == 1 and "is not a readable GGUF file" in run.err and not (tmp_path / "out").exists()


def test_an_occupied_output_is_refused(cli, tmp_path: Path) -> None:
    source = write_gguf(tmp_path / "m.gguf", "llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    run = cli("model", "import", source, "--output", tmp_path / "out")
    assert run.code == 1 and "already exists and is not empty" in run.err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_a_missing_file_is_refused(cli, tmp_path: Path) -> None:
    run = cli("model", "import", tmp_path / "nope.gguf", "--output", tmp_path / "out")
    assert run.code == 1 and "does not exist" in run.err
