"""``ster model import`` refusals, on GGUF files the tests write themselves: each is one sentence on stderr, and
nothing is written."""

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


def assert_refused(run, message: str, tmp_path: Path, source: Path) -> None:
    """Exit 1, the message as stderr's last line and no traceback, and no file beside the GGUF."""
    assert run.code == 1
    lines = run.err.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in run.err, run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]


@pytest.mark.parametrize("architecture", ["gpt2", "gemma2", "falcon", "mistral"])
def test_another_architecture_is_refused_before_anything_is_written(cli, tmp_path: Path, architecture: str) -> None:
    """All four are read by transformers, and none is converted by Ster: a Mistral model is a llama GGUF."""
    source = write_gguf(tmp_path / f"{architecture}.gguf", architecture)
    run = cli("model", "import", source, "--output", tmp_path / "out")
    assert_refused(
        run,
        f'{source} declares model_type "{architecture}", which Ster cannot load; supported model '
        'types: "llama", "qwen2", "qwen3", "phi3", "gemma3"',
        tmp_path,
        source,
    )


def test_a_file_that_is_not_gguf_is_refused(cli, tmp_path: Path) -> None:
    source = tmp_path / "fake.gguf"
    source.write_bytes(b"definitely not a gguf file")
    run = cli("model", "import", source, "--output", tmp_path / "out")
    assert_refused(run, "is not a readable GGUF file", tmp_path, source)


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


def family_file(tmp_path: Path, family: str, **options) -> Path:
    from tests.model.gguf_files import write_family_gguf

    return write_family_gguf(tmp_path, family, **options)[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"tensors": {"rope_freqs.weight": np.array([1, 2, 1, 2, 1, 2, 1, 2], dtype=np.float32)}},  # no Llama 3 rope
            "scales its rope by per-frequency factors (rope_freqs.weight",
        ),
        (
            {"metadata": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}},
            'uses rope scaling "yarn"; Ster imports GGUF files with linear rope scaling or none',
        ),
    ],
)
def test_rope_scaling_the_import_cannot_rebuild_is_refused_from_the_header(
    cli, tmp_path: Path, options, message: str
) -> None:
    """transformers' reader would drop both and load a model with no rope scaling."""
    source = family_file(tmp_path, "llama", **options)
    assert_refused(
        cli("model", "import", source, "--output", tmp_path / "out"), f"{source} {message}", tmp_path, source
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"drop": ["blk.1.ffn_down.weight"]},
            "has no tensor for 1 of the model's parameters (model.layers.1.mlp.down_proj.weight first)",
        ),
        (
            {"tensors": {"blk.0.attn_q_norm.weight": np.ones(12, dtype=np.float32)}},
            "holds 39 tensors and its qwen2 model takes 38; transformers' GGUF reader would drop the rest",
        ),
        (
            {"tensors": {"blk.0.attn_q.weight": np.zeros((48, 40), dtype=np.float32)}},
            "stores model.layers.0.self_attn.q_proj.weight with shape [48, 40], where its header's shape settings make it "
            "[48, 48]",
        ),
        (
            {"tokenizer_model": "bert"},
            "transformers could not read {source}: Cannot build a tokenizer from a GGUF file stating tokenizer 'bert'",
        ),
    ],
)
def test_a_file_transformers_cannot_read_whole_is_refused_in_one_sentence(
    cli, tmp_path: Path, options, message: str
) -> None:
    """A tensor missing (left at random), one too many (dropped), a shape the header contradicts, a vocabulary
    transformers cannot rebuild: each a refusal naming what, not a model with random or missing weights."""
    source = family_file(tmp_path, "qwen2", **options)
    run = cli("model", "import", source, "--output", tmp_path / "out")
    assert_refused(run, message.format(source=source), tmp_path, source)
