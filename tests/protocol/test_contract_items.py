"""Small contract items: --device metal, the in-flight registry of atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ster.engine.protocol import inflight
from ster.engine.protocol.files import atomic_directory, write_atomic
from ster.engine.protocol.jobs import build_job_request


def test_metal_is_another_name_for_mps() -> None:
    request = build_job_request("generate", model="ster:toy", prompt="x", device="metal")
    assert request.device == "mps"
    synthesize = build_job_request("pairs synthesize", trait="x", count=1, output="o.json", device="metal")
    assert synthesize.device == "mps"


def test_metal_reaches_the_device_check(cli) -> None:
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has a Metal device")
    run = cli("generate", "--model", "ster:toy", "--prompt", "x", "--device", "metal")
    assert run.code == 1
    sentence = "--device mps (metal) was asked for, but this torch build sees no Metal device"
    assert run.err.splitlines()[-1] == f"error: {sentence}"


def test_a_write_is_registered_only_while_it_is_in_flight(tmp_path: Path) -> None:
    seen: list[list[Path]] = []
    write_atomic(tmp_path / "a.json", "{}")
    assert inflight.in_flight() == [] and (tmp_path / "a.json").read_text() == "{}"
    with atomic_directory(tmp_path / "model") as staging:
        seen.append(inflight.in_flight())
    assert seen == [[staging]] and inflight.in_flight() == []
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "broken"):
        raise RuntimeError("the writer failed")
    assert inflight.in_flight() == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "model"]


def test_remove_all_removes_files_and_directories(tmp_path: Path) -> None:
    fd, name = inflight.temp_file(dir=tmp_path, suffix=".tmp")
    os.close(fd)
    directory = Path(inflight.temp_directory(dir=tmp_path, suffix=".tmp"))
    (directory / "weights.bin").write_bytes(b"x")
    assert set(inflight.in_flight()) == {Path(name), directory}
    inflight.remove_all()
    assert inflight.in_flight() == [] and list(tmp_path.iterdir()) == []
