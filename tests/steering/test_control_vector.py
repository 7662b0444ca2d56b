"""llama.cpp's control-vector GGUF: Ster's files as llama.cpp's loader reads them, llama.cpp's and repeng's files
as Ster reads them, and every file llama.cpp's loader refuses refused in one sentence, nothing written.

The reference files are built with the gguf package's own writer, key by key as llama.cpp's cvector-generator
(tools/cvector-generator/cvector-generator.cpp, ``export_gguf``: int32 ``layer_count``, ``direction.1`` onwards)
and repeng (``ControlVector.export_gguf``: uint32 ``layer_count``, ``direction.{layer}``) write theirs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from ster.engine.protocol.errors import Refusal  # noqa: E402
from ster.engine.steering.control_vector import read_control_vector, write_control_vector  # noqa: E402

WIDTH = 8


def vector(seed: int, width: int = WIDTH) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).normal(size=width).astype(np.float32)]


def write_gguf(
    path: Path,
    tensors: dict[str, np.ndarray],
    architecture: str = "controlvector",
    prefix: str | None = None,
    layer_count: tuple[str, int] | None = None,
    hint: str | None = "llama",
) -> Path:
    """A GGUF written by the gguf package alone: ``layer_count`` is (the writer's add_ method's type, value)."""
    prefix = prefix or architecture
    writer = gguf.GGUFWriter(str(path), architecture)
    if hint is not None:
        writer.add_string(f"{prefix}.model_hint", hint)
    if layer_count is not None:
        getattr(writer, f"add_{layer_count[0]}")(f"{prefix}.layer_count", layer_count[1])
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def directions(*blocks: int, width: int = WIDTH) -> dict[str, np.ndarray]:
    return {f"direction.{block}": np.array(vector(block, width), dtype=np.float32) for block in blocks}


def test_a_written_file_reads_back_exactly(tmp_path: Path) -> None:
    vectors = {3: vector(3), 1: vector(1), 12: vector(12)}
    write_control_vector(tmp_path / "calm.gguf", vectors, "llama")
    read = read_control_vector(tmp_path / "calm.gguf")
    assert (read.model_hint, read.width) == ("llama", WIDTH)
    assert list(read.layers) == [1, 3, 12]
    assert read.layers == vectors  # float32 values round-trip exactly
    assert list(tmp_path.iterdir()) == [tmp_path / "calm.gguf"]  # no temporary left beside it


def test_the_written_file_is_what_llama_cpp_loads(tmp_path: Path) -> None:
    """Read back by the gguf package itself: the metadata llama.cpp's generator writes, and one F32 1-D tensor
    ``direction.N`` per block N (llama.cpp adds direction.N after block N; see test_llama_cpp_reference)."""
    write_control_vector(tmp_path / "calm.gguf", {2: vector(2), 5: vector(5)}, "gemma3")
    reader = gguf.GGUFReader(str(tmp_path / "calm.gguf"))
    fields = reader.fields
    assert fields["general.architecture"].contents() == "controlvector"
    assert fields["controlvector.model_hint"].contents() == "gemma3"
    assert fields["controlvector.layer_count"].contents() == 2  # the number of directions, as llama.cpp counts
    assert fields["controlvector.layer_count"].types == [gguf.GGUFValueType.INT32]
    assert [t.name for t in reader.tensors] == ["direction.2", "direction.5"]
    for tensor, block in zip(reader.tensors, (2, 5), strict=True):
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(tensor.shape) == [WIDTH]
        assert tensor.data.tolist() == vector(block)


def test_tensors_of_any_dtype_and_device_are_written_as_float32(tmp_path: Path) -> None:
    vectors = {1: torch.tensor(vector(1), dtype=torch.bfloat16), 2: np.array(vector(2), dtype=np.float64)}
    write_control_vector(tmp_path / "v.gguf", vectors, "llama")
    read = read_control_vector(tmp_path / "v.gguf")
    assert read.layers[1] == vectors[1].float().tolist()
    assert read.layers[2] == vector(2)


def test_a_file_like_llama_cpps_cvector_generator_writes_is_read(tmp_path: Path) -> None:
    """cvector-generator: direction.1 .. direction.(n_layer - 1), layer_count as int32."""
    path = write_gguf(tmp_path / "cvec.gguf", directions(*range(1, 6)), layer_count=("int32", 5))
    read = read_control_vector(path)
    assert (read.model_hint, read.width, list(read.layers)) == ("llama", WIDTH, [1, 2, 3, 4, 5])
    assert read.layers[4] == vector(4)


def test_a_file_like_repengs_export_gguf_writes_is_read(tmp_path: Path) -> None:
    """repeng: its layers (by default the last block back to block 1, in that order), layer_count as uint32."""
    path = write_gguf(tmp_path / "repeng.gguf", directions(5, 4, 3, 2, 1), layer_count=("uint32", 5), hint="mistral")
    read = read_control_vector(path)
    assert (read.model_hint, list(read.layers)) == ("mistral", [1, 2, 3, 4, 5])
    assert read.layers[5] == vector(5)


@pytest.mark.parametrize("kind", ["int32", "uint32", "int64", "uint64", "uint16", "int8"])
def test_steeringvector_keys_and_any_integer_layer_count_are_read(tmp_path: Path, kind: str) -> None:
    path = write_gguf(tmp_path / "v.gguf", directions(7, 9), "steeringvector", layer_count=(kind, 2), hint="qwen2")
    read = read_control_vector(path)
    assert (read.model_hint, list(read.layers)) == ("qwen2", [7, 9])


def test_controlvector_keys_under_a_steeringvector_architecture_are_read(tmp_path: Path) -> None:
    """A writer that mixes the two prefixes still has its hint read (the architecture's own prefix first)."""
    path = write_gguf(tmp_path / "v.gguf", directions(2), "steeringvector", prefix="controlvector")
    assert read_control_vector(path).model_hint == "llama"
    path = write_gguf(tmp_path / "w.gguf", directions(2), prefix="steeringvector", hint="phi3")
    assert read_control_vector(path).model_hint == "phi3"


def test_a_file_without_a_model_hint_reads_with_none(tmp_path: Path) -> None:
    assert read_control_vector(write_gguf(tmp_path / "v.gguf", directions(1), hint=None)).model_hint is None


def _truncated(tmp_path: Path) -> Path:
    whole = write_gguf(tmp_path / "whole.gguf", directions(1, 2))
    cut = tmp_path / "v.gguf"
    cut.write_bytes(whole.read_bytes()[:-40])
    return cut


def _header_cut(tmp_path: Path) -> Path:
    whole = write_gguf(tmp_path / "whole.gguf", directions(1, 2))
    cut = tmp_path / "v.gguf"
    cut.write_bytes(whole.read_bytes()[:60])
    return cut


def _model_gguf(tmp_path: Path) -> Path:
    return write_gguf(
        tmp_path / "v.gguf", {"token_embd.weight": np.zeros((4, WIDTH), dtype=np.float32)}, "llama", hint=None
    )


def _other_width(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "v.gguf", {**directions(1), **directions(2, width=WIDTH + 1)})


def _not_finite(tmp_path: Path) -> Path:
    bad = np.array(vector(2), dtype=np.float32)
    bad[3] = np.nan
    return write_gguf(tmp_path / "v.gguf", {**directions(1), "direction.2": bad})


REFUSED = {
    "not a GGUF": (lambda p: _write(p / "v.gguf", b'{"vectors": []}'), "{path} is truncated or not a GGUF file"),
    "empty": (lambda p: _write(p / "v.gguf", b""), "{path} is truncated or not a GGUF file"),
    "truncated data": (_truncated, "{path} is truncated or not a GGUF file"),
    "truncated header": (_header_cut, "{path} is truncated or not a GGUF file"),
    "a model": (_model_gguf, "{path} is a GGUF of architecture llama, not a control vector"),
    "direction.0": (
        lambda p: write_gguf(p / "v.gguf", directions(0, 1)),
        "{path} holds direction.0, which llama.cpp refuses (the format steers blocks 1 onwards)",
    ),
    "F16": (
        lambda p: write_gguf(p / "v.gguf", {"direction.1": np.ones(WIDTH, dtype=np.float16)}),
        "{path}: tensor direction.1 is F16, where llama.cpp reads only F32",
    ),
    "2-D": (
        lambda p: write_gguf(p / "v.gguf", {"direction.1": np.ones((2, WIDTH), dtype=np.float32)}),
        "{path}: tensor direction.1 is not a one-dimensional list of values, as llama.cpp requires",
    ),
    "two widths": (
        _other_width,
        f"{{path}}: direction.2 has {WIDTH + 1} values where direction.1 has {WIDTH}, and llama.cpp refuses "
        "directions of two widths",
    ),
    "NaN": (_not_finite, "{path}: tensor direction.2 holds a value that is not finite"),
    "no directions": (
        lambda p: write_gguf(p / "v.gguf", {}),
        "{path} holds no direction tensors, so it steers nothing",
    ),
    "another name": (
        lambda p: write_gguf(p / "v.gguf", {**directions(1), "bias.1": np.ones(WIDTH, dtype=np.float32)}),
        "{path} holds a tensor bias.1, where a control vector holds only tensors named direction.N",
    ),
    "no number": (
        lambda p: write_gguf(p / "v.gguf", {"direction.x": np.ones(WIDTH, dtype=np.float32)}),
        "{path} holds a tensor direction.x, where a control vector holds only tensors named direction.N",
    ),
    "a leading zero": (
        lambda p: write_gguf(p / "v.gguf", {"direction.01": np.ones(WIDTH, dtype=np.float32)}),
        "{path} holds a tensor direction.01, where a control vector holds only tensors named direction.N",
    ),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_file_llama_cpp_refuses_is_refused_in_one_sentence(tmp_path: Path, case: str) -> None:
    make, sentence = REFUSED[case]
    path = make(tmp_path)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(Refusal) as refused:
        read_control_vector(path)
    assert str(refused.value) == sentence.format(path=path)
    assert sorted(tmp_path.iterdir()) == before


def test_a_missing_file_and_a_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal, match="does not exist"):
        read_control_vector(tmp_path / "absent.gguf")
    with pytest.raises(Refusal, match="is a directory, not a GGUF file"):
        read_control_vector(tmp_path)


WRITE_REFUSED = {
    "block 0": ({0: vector(0), 1: vector(1)}, "llama", "block 0 cannot be steered through a control vector"),
    "negative": ({-1: vector(1)}, "llama", "block -1 cannot be steered through a control vector"),
    "NaN": ({1: [math.nan] * WIDTH}, "llama", "block 1's vector holds a value that is not a finite float32"),
    "beyond float32": ({1: [1e39] * WIDTH}, "llama", "block 1's vector holds a value that is not a finite float32"),
    "two widths": (
        {1: vector(1), 2: vector(2, WIDTH + 1)},
        "llama",
        f"block 2's vector has {WIDTH + 1} values where block 1's has {WIDTH}",
    ),
    "empty vector": ({1: []}, "llama", "block 1's vector is not a list of values"),
    "a matrix": ({1: [vector(1)]}, "llama", "block 1's vector is not a list of values"),
    "nothing": ({}, "llama", "there is no vector to write"),
    "no hint": ({1: vector(1)}, " ", "a control vector names the architecture it was made for"),
}


@pytest.mark.parametrize("case", list(WRITE_REFUSED))
def test_a_vector_llama_cpp_would_refuse_is_not_written(tmp_path: Path, case: str) -> None:
    vectors, hint, phrase = WRITE_REFUSED[case]
    target = tmp_path / "v.gguf"
    with pytest.raises(Refusal) as refused:
        write_control_vector(target, vectors, hint)
    assert str(refused.value).startswith(f"{target} was not written: ") and phrase in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_write_leaves_the_file_there_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "v.gguf"
    write_control_vector(target, {1: vector(1)}, "llama")
    before = target.read_bytes()
    with pytest.raises(Refusal):
        write_control_vector(target, {1: [math.inf] * WIDTH}, "llama")
    assert target.read_bytes() == before and list(tmp_path.iterdir()) == [target]


def test_under_a_server_root_a_link_out_is_refused_both_ways(tmp_path: Path) -> None:
    """Read through ``confine.readable`` and written through ``confine.writable``: inside the root both work; a
    link leading out of it is refused before anything outside is read or written."""
    from ster.engine.protocol import confine

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    write_control_vector(outside / "secret.gguf", {1: vector(1)}, "llama")
    (root / "in.gguf").symlink_to(outside / "secret.gguf")
    (root / "out").symlink_to(outside)
    with confine.within(confine.Root(root)):
        write_control_vector(root / "calm.gguf", {2: vector(2)}, "llama")
        assert read_control_vector(root / "calm.gguf").layers == {2: vector(2)}
        with pytest.raises(confine.Outside):
            read_control_vector(root / "in.gguf")
        with pytest.raises(confine.Outside):
            write_control_vector(root / "out" / "new.gguf", {2: vector(2)}, "llama")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.gguf"]
