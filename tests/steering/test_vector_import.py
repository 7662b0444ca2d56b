"""``ster vector import``: a control vector becomes an artifact that steers as the file does (``1x`` adds each
vector as it was), bound to ``--model`` with a warning that nothing but its width and blocks was checked; a
file of another width, more blocks, another architecture or cut short is refused, with nothing written."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ster.engine.model.resolve import TOY_DIR
from ster.engine.protocol.events import Warning
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.engine.steering.intervention import added
from tests.steering.test_bake import IDS, close, live_logits, write_artifact
from tests.steering.test_control_vector import write_gguf

gguf = pytest.importorskip("gguf")


def run(name: str, **fields):
    events = []
    final = run_job(name, build_job_request(name, **fields), events.append, threading.Event())
    return final, events


def test_a_baked_control_vector_imports_to_an_artifact_that_steers_as_the_original_did(tmp_path: Path) -> None:
    vectors = write_artifact(tmp_path / "a.json", TOY_DIR, [1, 2])
    baked, _ = run(
        "bake",
        model=str(TOY_DIR),
        vector=tmp_path / "a.json",
        strength="3",
        format="llama-cpp",
        output=tmp_path / "calm.gguf",
    )
    assert baked.type == "result", baked
    final, events = run(
        "vector import", model=str(TOY_DIR), control_vector=tmp_path / "calm.gguf", output=tmp_path / "i.json"
    )
    assert final.type == "result", final
    warnings = [event.message for event in events if isinstance(event, Warning)]
    assert any("records no fingerprint of the model it was made for" in sentence for sentence in warnings)
    artifact = json.loads((tmp_path / "i.json").read_text())
    assert artifact["method"] == "imported" and artifact["strength_unit"] == "vector"
    assert artifact["trait_name"] == "calm" and artifact["model_fingerprint"].startswith("ster-fp1:")
    assert [layer["layer"] for layer in artifact["vectors"]] == [1, 2]
    for layer in artifact["vectors"]:
        assert layer["vector_norm"] == pytest.approx(3.0, rel=1e-6)  # the strength folded into the file
        assert np.allclose(layer["values"], vectors[layer["layer"]], atol=1e-6)
    # generate at its default (1x: the vectors as they were) is the original artifact at strength 3
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.artifact import load_artifact
    from ster.engine.steering.generate import given_strength

    imported = load_artifact(tmp_path / "i.json")
    request = build_job_request("generate", model=str(TOY_DIR), prompt="x", vector=tmp_path / "i.json")
    strength = given_strength(request, JobContext(lambda event: None), imported)
    assert (strength.value, strength.unit) == (1.0, "relative")
    scales = strength.per_layer(imported.unit_scales(), imported.unit)
    want = live_logits(TOY_DIR, added(vectors, {1: 3.0, 2: 3.0}))
    assert close(live_logits(TOY_DIR, added(imported.by_layer(), scales)), want) <= 1e-5
    assert close(live_logits(TOY_DIR, {}), want) > 1e-3


def test_repeng_and_steeringvector_files_import_with_their_hint_checked(tmp_path: Path) -> None:
    width = 64
    data = {f"direction.{block}": np.full(width, 0.5, dtype=np.float32) for block in (1, 3)}
    path = write_gguf(tmp_path / "r.gguf", data, prefix="steeringvector", layer_count=("uint32", 2), hint="mistral")
    final, events = run(
        "vector import", model=str(TOY_DIR), control_vector=path, output=tmp_path / "r.json", trait_name="honest"
    )
    assert final.type == "result", final
    assert any("names a mistral model, and" in getattr(event, "message", "") for event in events)
    artifact = json.loads((tmp_path / "r.json").read_text())
    assert artifact["trait_name"] == "honest" and [v["layer"] for v in artifact["vectors"]] == [1, 3]
    assert artifact["vectors"][0]["vector_norm"] == pytest.approx(0.5 * width**0.5)


@pytest.mark.parametrize(
    ("case", "sentence"),
    [
        ("width", "is 8 wide, and {model}'s residual stream is 64: it was made for another model"),
        ("blocks", "holds a direction for block 9, and {model} has blocks 0..3: it was made for another model"),
        ("model", "is a GGUF of architecture llama, not a control vector"),
        ("cut", "is truncated or not a GGUF file"),
        ("zero", "holds direction.0, which llama.cpp refuses"),
    ],
)
def test_a_file_that_does_not_fit_is_refused_with_nothing_written(tmp_path: Path, case: str, sentence: str) -> None:
    path = tmp_path / "v.gguf"
    if case == "width":
        write_gguf(path, {"direction.1": np.ones(8, dtype=np.float32)})
    elif case == "blocks":
        write_gguf(path, {"direction.9": np.ones(64, dtype=np.float32)})
    elif case == "model":
        write_gguf(path, {"token_embd.weight": np.zeros((4, 64), dtype=np.float32)}, "llama", hint=None)
    elif case == "cut":
        whole = write_gguf(tmp_path / "w.gguf", {"direction.1": np.ones(64, dtype=np.float32)})
        path.write_bytes(whole.read_bytes()[:-40])
    else:
        write_gguf(path, {"direction.0": np.ones(64, dtype=np.float32)})
    final, _ = run("vector import", model=str(TOY_DIR), control_vector=path, output=tmp_path / "out.json")
    assert final.type == "error" and final.kind == "refused"
    assert sentence.format(model=TOY_DIR) in final.message, final.message
    assert not (tmp_path / "out.json").exists()
    assert torch.tensor(IDS).numel() == len(IDS)
