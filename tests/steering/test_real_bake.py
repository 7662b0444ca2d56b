"""``ster bake`` on SmolLM2-135M-Instruct: the baked checkpoint, loaded by transformers' own model, gives the
logits of live ablation and of live steering in Ster within 1e-4 at f32, and the LoRA under ``peft.PeftModel``
those of live ablation; on Gemma 3 270M, whose writes pass a norm before they are added, the ablation too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ster.engine.model.config import load_config
from ster.engine.model.resolve import resolve_model
from ster.engine.steering.intervention import Profile, added, projecting, sites
from tests.steering.test_bake import EXACT, bake, close, hf_logits, live_logits, write_artifact

pytestmark = pytest.mark.real


def baked_ablation_is_live(model: Path, layer: int, tmp_path: Path) -> tuple[dict[int, list[float]], torch.Tensor]:
    """Bake an ablation of a direction at ``layer`` into a checkpoint, and hold transformers' logits on it to live
    ablation in Ster; the artifact's directions and those logits, for more checks."""
    blocks = load_config(resolve_model(str(model)).config).num_hidden_layers
    vectors = write_artifact(tmp_path / "a.json", model, [layer])
    want = live_logits(model, projecting(vectors, sites("ablate", None, [layer], blocks), Profile()))
    baking = bake(model=str(model), vector=tmp_path / "a.json", mode="ablate", output=tmp_path / "ablated")
    assert baking.type == "result", baking
    baked = hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "ablated", dtype=torch.float32).eval())
    assert close(baked, want) <= EXACT
    return vectors, want


def test_smollm2_baked_ablation_steering_and_lora_equal_live_editing(smol: Path, tmp_path: Path) -> None:
    vectors, want = baked_ablation_is_live(smol, 15, tmp_path)
    base = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    assert close(hf_logits(base), want) > 1e-3

    from peft import PeftModel

    lora = bake(model=str(smol), vector=tmp_path / "a.json", mode="ablate", format="lora", output=tmp_path / "lora")
    assert lora.type == "result", lora
    assert close(hf_logits(PeftModel.from_pretrained(base, tmp_path / "lora").eval()), want) <= EXACT

    steered = bake(model=str(smol), vector=tmp_path / "a.json", strength="2", output=tmp_path / "steered")
    assert steered.type == "result", steered
    want = live_logits(smol, added(vectors, {15: 2.0}))  # an absolute strength: 2 along the unit direction
    got = hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "steered", dtype=torch.float32).eval())
    assert close(got, want) <= EXACT


def test_gemma3_baked_ablation_equals_live_ablation(gemma: Path, tmp_path: Path) -> None:
    baked_ablation_is_live(gemma, 9, tmp_path)
