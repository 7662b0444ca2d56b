"""PEFT interop on Phi-3, whose checkpoint fuses q, k, v into ``qkv_proj`` and gate, up into ``gate_up_proj``.

transformers' Phi-3 has only the fused modules, so PEFT adapts those; Ster's decoder has the separate
projections. The independent computation is peft on transformers' ``Phi3ForCausalLM``: an adapter peft
made on the fused modules must give, read by Ster, peft's logits; an adapter Ster trained on the
separate projections, exported, must give through ``PeftModel.from_pretrained`` Ster's logits; and
the export must read back as the same update.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ster.engine.model.adapters.artifact import TARGETS, factor_names
from ster.engine.model.adapters.lora import Adapter, attached, load_adapter
from ster.engine.model.adapters.peft_format import read_peft_dir
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.protocol.errors import Refusal
from tests.model.test_families import build
from tests.tune.adapter_files import edit_sidecar, write_adapter

CPU = torch.device("cpu")
IDS = torch.tensor([[1, 14, 20, 33, 41, 52, 60, 71, 80, 90, 17]])
"""Longer than the fixture's sliding window of 5."""
FUSED_MODULES = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
PIECES = {
    "query": "qkv_proj",
    "key": "qkv_proj",
    "value": "qkv_proj",
    "output": "o_proj",
    "gate": "gate_up_proj",
    "up": "gate_up_proj",
    "down": "down_proj",
}
"""Each Ster target → the module of transformers' Phi-3 that holds it."""


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Phi-3 (3 layers, 48 wide, fused projections) saved by transformers beside the toy tokenizer."""
    path, _ = build("phi3", tmp_path_factory.mktemp("phi3"))
    return path


def ster_logits(model: Path, adapter: Adapter | None) -> torch.Tensor:
    source = resolve_model(str(model))
    decoder = load_decoder(source, load_config(source.config), "f32", CPU)
    with torch.inference_mode(), attached(decoder, adapter):
        return decoder(IDS, vocab="all").logits


def hf_phi3(model: Path):
    from transformers import Phi3ForCausalLM

    return Phi3ForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager").eval()


def peft_logits(model: Path, peft_dir: Path) -> torch.Tensor:
    from peft import PeftModel

    wrapped = PeftModel.from_pretrained(hf_phi3(model), str(peft_dir)).eval()
    with torch.inference_mode():
        return wrapped(IDS).logits


def make_peft_dir(model: Path, out: Path, **config) -> Path:
    """An adapter peft makes on transformers' Phi-3: random A and B (init_lora_weights False), not the identity."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    get_peft_model(hf_phi3(model), LoraConfig(init_lora_weights=False, **config)).save_pretrained(str(out))
    return out


def updates(adapter: Adapter) -> dict[str, torch.Tensor]:
    """Each adapted projection's ``scale · B @ A``, by factor-name prefix."""
    return {
        a[:-2]: adapter.scale * adapter.tensors[b] @ adapter.tensors[a]
        for layer in adapter.layers
        for a, b in (factor_names(layer, t) for t in adapter.targets)
    }


# PEFT → Ster ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"r": 4, "lora_alpha": 8, "target_modules": ["qkv_proj", "gate_up_proj", "o_proj", "down_proj"]},
        {
            "r": 3,
            "lora_alpha": 5,
            "target_modules": ["qkv_proj", "down_proj"],
            "use_rslora": True,
            "layers_to_transform": [0, 2],
        },
    ],
    ids=["fused-and-plain", "rslora-two-layers"],
)
def test_a_peft_adapter_on_the_fused_modules_gives_peft_logits_on_ster(
    phi3: Path, tmp_path: Path, config: dict
) -> None:
    peft_dir = make_peft_dir(phi3, tmp_path / "peft", **config)
    sidecar, adapter = read_peft_dir(peft_dir, load_config(phi3 / "config.json"), CPU)
    assert sidecar.targets == [t for t in TARGETS if PIECES[t] in config["target_modules"]]
    assert (sidecar.rank, sidecar.layers) == (config["r"], config.get("layers_to_transform", [0, 1, 2]))
    for layer in sidecar.layers:  # q, k and v share the fused module's A
        assert torch.equal(adapter.tensors[f"layers.{layer}.query.a"], adapter.tensors[f"layers.{layer}.value.a"])
    expected = peft_logits(phi3, peft_dir)
    assert (expected - ster_logits(phi3, None)).abs().max() > 1e-2  # the adapter does something
    torch.testing.assert_close(ster_logits(phi3, adapter), expected, atol=1e-4, rtol=1e-4)


def test_a_fused_peft_adapter_merges_inspects_and_generates_through_the_cli(cli, phi3: Path, tmp_path: Path) -> None:
    peft_dir = make_peft_dir(phi3, tmp_path / "peft", r=2, lora_alpha=4, target_modules=["qkv_proj", "gate_up_proj"])
    shown = cli("tune", "inspect", peft_dir)
    assert shown.code == 0, shown.err
    document = shown.json["adapter"]
    assert (document["product"], document["rank"], document["scale"], document["hidden_size"]) == ("peft", 2, 2.0, 48)
    assert document["targets"] == ["query", "key", "value", "gate", "up"]
    assert [entry["shape"] for entry in document["tensors"][:2]] == [[2, 48], [96, 2]]  # q 48 + k 24 + v 24 rows
    merged = tmp_path / "merged"
    run = cli("tune", "merge", "--model", phi3, "--adapter", peft_dir, "--output", merged)
    assert run.code == 0, run.err
    torch.testing.assert_close(ster_logits(merged, None), peft_logits(phi3, peft_dir), atol=1e-4, rtol=1e-4)
    run = cli(
        "generate", "--model", phi3, "--adapter", peft_dir, "--prompt", "question : a cat ?", "--max-new-tokens", "3"
    )
    assert run.code == 0, run.err


def test_a_fused_module_on_a_model_without_it_and_an_overlap_are_refused(phi3: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    peft_dir = make_peft_dir(phi3, tmp_path / "peft", r=2, lora_alpha=4, target_modules=["qkv_proj", "o_proj"])
    with pytest.raises(Refusal, match="adapts qkv_proj, a fused projection that a llama model does not have$"):
        read_peft_dir(peft_dir, load_config(TOY_DIR / "config.json"), CPU)
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    extra = {
        name.replace("qkv_proj", "q_proj"): (t[:48] if "lora_B" in name else t).clone()
        for name, t in tensors.items()
        if "qkv_proj" in name
    }
    save_file({**tensors, **extra}, str(peft_dir / "adapter_model.safetensors"))
    with pytest.raises(Refusal, match="adapts both qkv_proj and q_proj, a projection it stacks"):
        read_peft_dir(peft_dir, load_config(phi3 / "config.json"), CPU)


# Ster → PEFT ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("targets", "layers", "modules", "ranks"),
    [
        (tuple(TARGETS), (0, 1, 2), FUSED_MODULES, {"qkv_proj": 9, "gate_up_proj": 6}),
        (("value", "query", "up"), (0, 2), ["qkv_proj", "gate_up_proj"], {"qkv_proj": 6}),
    ],
    ids=["all-seven", "query-value-up"],
)
def test_an_export_loads_in_peft_on_the_fused_modules_with_ster_logits(
    cli, phi3: Path, tmp_path: Path, targets: tuple, layers: tuple, modules: list, ranks: dict
) -> None:
    from peft import LoraConfig

    path = tmp_path / "a.safetensors"
    ours = write_adapter(path, model=str(phi3), rank=3, alpha=5.0, targets=targets, layers=layers, b_scale=0.2)
    run = cli("tune", "export-peft", path, "--output", tmp_path / "peft")
    assert run.code == 0, run.err
    assert (run.json["target_modules"], run.json["rank"], run.json["alpha"]) == (modules, 3, 5.0)
    config = LoraConfig.from_pretrained(str(tmp_path / "peft"))
    assert (config.r, config.lora_alpha, sorted(config.target_modules)) == (3, 5, sorted(modules))
    assert config.rank_pattern == ranks
    assert config.alpha_pattern == {module: 5 * rank // 3 for module, rank in ranks.items()}
    expected = ster_logits(phi3, ours)
    assert (expected - ster_logits(phi3, None)).abs().max() > 1e-2
    torch.testing.assert_close(peft_logits(phi3, tmp_path / "peft"), expected, atol=1e-4, rtol=1e-4)
    # Read back, the export is the same update on every projection (rank padded, the scale kept); a piece of a
    # fused module that was not targeted reads as a zero update.
    sidecar, back = read_peft_dir(tmp_path / "peft", load_config(phi3 / "config.json"), CPU)
    assert (sidecar.targets, sidecar.layers) == ([t for t in TARGETS if PIECES[t] in modules], list(layers))
    assert sidecar.scale == pytest.approx(5.0 / 3, rel=1e-12)
    theirs, mine = updates(back), updates(ours)
    for name, update in theirs.items():
        if name in mine:
            torch.testing.assert_close(update, mine[name], atol=1e-6, rtol=1e-6)
        else:
            assert not update.any(), name
    torch.testing.assert_close(ster_logits(phi3, back), expected, atol=1e-5, rtol=1e-5)


def test_an_export_round_trips_through_inspect(cli, phi3: Path, tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_adapter(
        path, model=str(phi3), rank=2, alpha=6.0, targets=("query", "key", "value", "down"), layers=(1,), b_scale=0.1
    )
    assert cli("tune", "export-peft", path, "--output", tmp_path / "peft", "--base-model", "org/phi3").code == 0
    ster = cli("tune", "inspect", path).json["adapter"]
    peft = cli("tune", "inspect", tmp_path / "peft").json["adapter"]
    assert (peft["product"], peft["model"], peft["model_fingerprint"], peft["train"]) == (
        "peft",
        "org/phi3",
        None,
        None,
    )
    for key in ("targets", "layers", "hidden_size", "scale", "kind"):
        assert peft[key] == ster[key], key
    assert (peft["rank"], peft["alpha"]) == (6, 18.0)  # q, k and v in one rank-6 LoRA; down padded to 6 on reading
    assert [(entry["name"], entry["shape"]) for entry in peft["tensors"]] == [
        ("base_model.model.model.layers.1.self_attn.qkv_proj.lora_A.weight", [6, 48]),
        ("base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight", [96, 6]),
        ("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", [2, 80]),
        ("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", [48, 2]),
    ]
    _, ours = load_adapter(path, load_config(phi3 / "config.json"), CPU)
    _, back = read_peft_dir(tmp_path / "peft", load_config(phi3 / "config.json"), CPU)
    for name, update in updates(ours).items():
        torch.testing.assert_close(updates(back)[name], update, atol=1e-6, rtol=1e-6)


def test_an_export_whose_model_config_cannot_be_read_names_the_projections_separately(
    cli, phi3: Path, tmp_path: Path
) -> None:
    """The model an adapter was trained on may be gone (or offline): the export still runs, under the separate
    projections' names, and says why in a warning."""
    path = tmp_path / "a.safetensors"
    write_adapter(path, model=str(phi3), targets=("query",), layers=(0,))
    edit_sidecar(path, model=str(tmp_path / "gone"))
    run = cli("tune", "export-peft", path, "--output", tmp_path / "peft")
    assert run.code == 0, run.err
    assert f"cannot read the config.json of {tmp_path / 'gone'}, the model the adapter was trained on" in run.err
    assert "names each projection on its own" in run.err
    assert run.json["target_modules"] == ["q_proj"]
    assert json.loads(path.with_suffix(".json").read_text())["model"] == str(tmp_path / "gone")
