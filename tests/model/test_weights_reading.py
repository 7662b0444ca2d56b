"""Reading a checkpoint's weights into memory of the process's own, not through a memory map.

A mapped weights file stays mapped while any tensor of it lives, and every page a read has
touched stays in the process's resident memory; fusing q/k/v and gate/up reads those
weights to copy them, so their mapped pages stayed resident beside the copies. These tests
check the reader against safetensors' own, and that a loaded decoder maps no weights file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder, read_tensors
from ster.engine.model.resolve import resolve_model
from tests.conftest import REPO


def test_every_dtype_and_shape_reads_as_safetensors_reads_it(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=generator),
        "f16": torch.randn(4, 2, generator=generator).half(),
        "bf16": torch.randn(7, generator=generator).bfloat16(),
        "f64": torch.randn(2, 2, generator=generator).double(),
        "i64": torch.arange(6).reshape(2, 3),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    expected = load_file(str(path))
    read = dict(read_tensors(path, list(expected)))
    assert read.keys() == expected.keys()
    for name, tensor in expected.items():
        assert read[name].dtype == tensor.dtype and read[name].shape == tensor.shape, name
        assert torch.equal(read[name], tensor), name


def test_a_tensor_past_the_end_of_the_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # the header still promises 256 bytes of data
    with pytest.raises(ValueError, match="ends past the end of the file"):
        list(read_tensors(path, ["w"]))


CHECK_MAPS = """
import sys
from pathlib import Path
import torch
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model

source = resolve_model("ster:toy", None)
decoder = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
maps = Path("/proc/self/maps").read_text()
print(sum(str(path.resolve()) in maps for path in source.weights), len(decoder.state_dict()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_loaded_decoder_maps_no_weights_file_and_equals_the_mapped_read() -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHECK_MAPS],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    mapped_files, tensors = map(int, run.stdout.split())
    assert mapped_files == 0 and tensors > 0  # a fresh process: nothing else could have mapped the file
    source = resolve_model("ster:toy", None)
    decoder = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    state = decoder.state_dict()
    for name, tensor in load_file(str(source.weights[0])).items():
        assert torch.equal(state[name], tensor), name
