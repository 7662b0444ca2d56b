"""PEFT interop: ``tune export-peft`` and reading PEFT directories, checked against peft on transformers' model.

The independent computation is peft itself: a directory Ster writes must give, through
``PeftModel.from_pretrained`` on ``transformers``' Llama, the logits Ster's decoder gives
with the adapter attached; and an adapter peft made must give, read by Ster, peft's logits.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from ster.cli import main
from ster.engine.model.adapters.artifact import AdapterSidecar
from ster.engine.model.adapters.lora import Adapter, attached, load_adapter, save_adapter
from ster.engine.model.adapters.peft_format import peft_key, peft_model_note, read_peft_dir
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.protocol.errors import Refusal
from tests.tune.adapter_files import record_hash

CPU = torch.device("cpu")
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOY_IDS = torch.tensor([[1, 5, 17, 40, 90, 33, 7, 61], [1, 12, 3, 3, 77, 20, 45, 9]])


def ster_logits(model: str | Path, adapter: Adapter | None, ids: torch.Tensor) -> torch.Tensor:
    source = resolve_model(str(model))
    decoder = load_decoder(source, load_config(source.config), "f32", CPU)
    with torch.inference_mode(), attached(decoder, adapter):
        return decoder(ids, vocab="all").logits


def hf_model(model_dir: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def peft_logits(model_dir: Path, peft_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from peft import PeftModel

    model = PeftModel.from_pretrained(hf_model(model_dir), str(peft_dir)).eval()
    with torch.inference_mode():
        return model(ids).logits


def make_peft_dir(model_dir: Path, out: Path, seed: int = 0, **config) -> Path:
    """An adapter peft makes: random A and B (init_lora_weights False), so it is not the identity."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(hf_model(model_dir), LoraConfig(init_lora_weights=False, **config))
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SFT adapter on the toy: every projection on layers 1 and 3."""
    home = tmp_path_factory.mktemp("sft")
    out = home / "a.safetensors"
    with pytest.MonkeyPatch.context() as patch:  # the autouse private home is per test; this runs once
        patch.setenv("XDG_DATA_HOME", str(home / "data"))
        patch.setenv("XDG_STATE_HOME", str(home / "state"))
        code = main(
            [
                "tune",
                "sft",
                "--model",
                "ster:toy",
                "--examples",
                "ster:examples",
                "--output",
                str(out),
                "--learning-rate",
                "0.05",
                "--epochs",
                "2",
                "--rank",
                "4",
                "--alpha",
                "8",
                "--targets",
                "query,key,value,output,gate,up,down",
                "--layers",
                "1,3",
            ]
        )
    assert code == 0
    return out


def test_export_loads_in_peft_with_ster_logits_and_reads_back_identically(cli, trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "peft"
    run = cli("tune", "export-peft", trained, "--output", out)
    assert run.code == 0, run.err
    result = run.json
    assert (result["rank"], result["alpha"], result["layers"], result["tensors"]) == (4, 8.0, [1, 3], 28)
    assert result["target_modules"] == SEVEN
    assert result["base_model"] == "ster:toy" and sorted(p.name for p in out.iterdir()) == result["files"]
    config = load_config(TOY_DIR / "config.json")
    _, ours = load_adapter(trained, config, CPU)
    expected = ster_logits("ster:toy", ours, TOY_IDS)
    assert (expected - ster_logits("ster:toy", None, TOY_IDS)).abs().max() > 1e-2  # the adapter does something
    torch.testing.assert_close(peft_logits(TOY_DIR, out, TOY_IDS), expected, atol=1e-4, rtol=1e-4)
    sidecar, back = read_peft_dir(out, config, CPU)
    assert (sidecar.rank, sidecar.alpha, sidecar.targets, sidecar.layers) == (4, 8.0, ours.targets, [1, 3])
    assert (sidecar.model, sidecar.model_fingerprint, sidecar.train, sidecar.kind) == (
        "ster:toy",
        None,
        None,
        "adapter",
    )
    assert list(back.tensors) == list(ours.tensors)
    for name, tensor in ours.tensors.items():
        assert torch.equal(back.tensors[name], tensor), name


def test_export_config_is_what_peft_reads(cli, trained: Path, tmp_path: Path) -> None:
    from peft import LoraConfig

    out = tmp_path / "peft"
    assert cli("tune", "export-peft", trained, "--output", out, "--base-model", "org/base").code == 0
    config = LoraConfig.from_pretrained(str(out))
    assert (config.r, config.lora_alpha, config.layers_to_transform, config.base_model_name_or_path) == (
        4,
        8,
        [1, 3],
        "org/base",
    )
    assert (config.task_type, config.bias, config.lora_dropout, config.use_rslora) == ("CAUSAL_LM", "none", 0.0, False)
    assert set(config.target_modules) == set(SEVEN)
    again = tmp_path / "again"
    assert cli("tune", "export-peft", trained, "--output", again, "--base-model", "org/base").code == 0
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.parametrize(
    "config",
    [
        {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "gate_proj"]},
        {"r": 3, "lora_alpha": 5, "target_modules": SEVEN, "use_rslora": True, "layers_to_transform": [0, 2]},
        {"r": 2, "lora_alpha": 2, "target_modules": "all-linear"},
    ],
    ids=["three-targets", "rslora-two-layers", "all-linear"],
)
def test_a_peft_adapter_gives_peft_logits_on_ster(tmp_path: Path, config: dict) -> None:
    peft_dir = make_peft_dir(TOY_DIR, tmp_path / "peft", **config)
    sidecar, adapter = read_peft_dir(peft_dir, load_config(TOY_DIR / "config.json"), CPU)
    assert sidecar.rank == config["r"]
    assert sidecar.layers == config.get("layers_to_transform", [0, 1, 2, 3])
    if config.get("use_rslora"):
        assert math.isclose(sidecar.alpha / sidecar.rank, config["lora_alpha"] / math.sqrt(config["r"]))
    expected = peft_logits(TOY_DIR, peft_dir, TOY_IDS)
    assert (expected - ster_logits("ster:toy", None, TOY_IDS)).abs().max() > 1e-2
    torch.testing.assert_close(ster_logits("ster:toy", adapter, TOY_IDS), expected, atol=1e-4, rtol=1e-4)


def test_a_peft_adapter_names_its_hub_model_and_is_applied_with_a_warning(tmp_path: Path) -> None:
    peft_dir = make_peft_dir(TOY_DIR, tmp_path / "peft", r=2, lora_alpha=4, target_modules=["q_proj"])
    document = json.loads((peft_dir / "adapter_config.json").read_text())
    document["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (peft_dir / "adapter_config.json").write_text(json.dumps(document))
    sidecar, _ = read_peft_dir(peft_dir, load_config(TOY_DIR / "config.json"), CPU)
    assert peft_model_note(sidecar, "HuggingFaceTB/SmolLM2-135M-Instruct") is None
    note = peft_model_note(sidecar, "/models/smollm2")
    assert note is not None and '"HuggingFaceTB/SmolLM2-135M-Instruct"' in note and '"/models/smollm2"' in note
    with pytest.raises(Refusal, match="^adapter artifact is a generation adapter, not a reward model$"):
        peft_model_note(sidecar, "/models/smollm2", want="reward")


# Refusals ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_dir(
        TOY_DIR, tmp_path_factory.mktemp("made") / "peft", r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]
    )


def edited(made: Path, tmp_path: Path, **changes) -> Path:
    target = tmp_path / "edited"
    shutil.copytree(made, target)
    document = json.loads((target / "adapter_config.json").read_text())
    document.update(changes)
    (target / "adapter_config.json").write_text(json.dumps(document))
    return target


def refused(path: Path, config_dir: Path = TOY_DIR) -> str:
    with pytest.raises(Refusal) as caught:
        read_peft_dir(path, load_config(config_dir / "config.json"), CPU)
    return str(caught.value)


@pytest.mark.parametrize(
    ("changes", "sentence"),
    [
        ({"peft_type": "IA3"}, "is of type IA3; Ster applies LoRA adapters only"),
        (
            {"use_dora": True},
            ("uses DoRA (use_dora), whose magnitude vector rescales each projection; Ster applies plain LoRA only"),
        ),
        (
            {"rank_pattern": {"q_proj": 4}},
            (
                "scales v_proj on layer 0 by 2 but q_proj on layer 0 by 1 (rank_pattern, "
                "alpha_pattern); a Ster adapter has one scale"
            ),
        ),
        ({"alpha_pattern": {"v_proj": 2}}, "scales v_proj on layer 0 by 1 but q_proj on layer 0 by 2"),
        (
            {"modules_to_save": ["lm_head"]},
            ("also trains whole modules (lm_head, modules_to_save), which a Ster adapter cannot carry"),
        ),
        ({"bias": "lora_only"}, "trains biases (bias 'lora_only', lora_bias False), which a Ster adapter cannot carry"),
        (
            {"target_modules": ["q_proj", "lm_head"]},
            (
                'targets "lm_head", which is not one of the seven projections '
                "Ster adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj)"
            ),
        ),
        (
            {"layers_to_transform": [0, 1]},
            ("lists layers [0, 1] in layers_to_transform but holds factors for layers [0, 1, 2, 3]"),
        ),
        (
            {"init_lora_weights": "pissa"},
            "was initialised with pissa, which rewrites the base weights it trains against",
        ),
        (
            {"alora_invocation_tokens": [5, 6]},
            "uses the LoRA variant alora_invocation_tokens, which changes the update",
        ),
        ({"trainable_token_indices": [3]}, "trains token embeddings (trainable_token_indices)"),
        ({"brand_new_variant": {"x": 1}}, "sets brand_new_variant, which peft"),
    ],
)
def test_what_ster_cannot_apply_is_refused_in_one_sentence(
    made: Path, tmp_path: Path, changes: dict, sentence: str
) -> None:
    message = refused(edited(made, tmp_path, **changes))
    assert sentence in message and message.count(". ") == 0


def test_unknown_keys_left_at_their_defaults_are_ignored(made: Path, tmp_path: Path) -> None:
    sidecar, _ = read_peft_dir(
        edited(made, tmp_path, brand_new_option=None, runtime_config={"x": 1}),
        load_config(TOY_DIR / "config.json"),
        CPU,
    )
    assert sidecar.targets == ["query", "value"]


def test_missing_files_pickles_and_foreign_tensors_are_refused(made: Path, tmp_path: Path) -> None:
    assert "has no adapter_config.json, so it is not a PEFT adapter directory" in refused(tmp_path)
    pickled = edited(made, tmp_path)
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    assert "stores its weights as adapter_model.bin, a pickle Ster does not load" in refused(pickled)
    from safetensors.torch import load_file, save_file

    for extra, sentence in (
        ("base_model.model.lm_head.modules_to_save.default.weight", "which is not a LoRA factor of one of the seven"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", "which is not a LoRA factor"),
    ):
        target = tmp_path / extra
        shutil.copytree(made, target)
        tensors = load_file(str(made / "adapter_model.safetensors"))
        save_file({**tensors, extra: torch.zeros(3)}, str(target / "adapter_model.safetensors"))
        assert f"holds tensor {extra}, {sentence}" in refused(target)
    lopsided = tmp_path / "lopsided"
    shutil.copytree(made, lopsided)
    tensors = load_file(str(made / "adapter_model.safetensors"))
    del tensors[peft_key(2, "value", "a")], tensors[peft_key(2, "value", "b")]
    save_file(tensors, str(lopsided / "adapter_model.safetensors"))
    assert f"but no {peft_key(2, 'value', 'a')}; a Ster adapter carries both factors" in refused(lopsided)


def test_a_bare_model_prefix_reads_and_a_non_finite_factor_is_refused(made: Path, tmp_path: Path) -> None:
    """A PEFT model wrapped around ``LlamaModel`` (no LM head) names its factors without the inner ``model.``."""
    from safetensors.torch import load_file, save_file

    config = load_config(TOY_DIR / "config.json")
    _, expected = read_peft_dir(made, config, CPU)
    bare = edited(made, tmp_path)
    tensors = load_file(str(made / "adapter_model.safetensors"))
    renamed = {name.replace("base_model.model.model.", "base_model.model."): t for name, t in tensors.items()}
    save_file(renamed, str(bare / "adapter_model.safetensors"))
    _, got = read_peft_dir(bare, config, CPU)
    assert all(torch.equal(got.tensors[name], t) for name, t in expected.tensors.items())
    key = "base_model.model.layers.1.self_attn.v_proj.lora_B.weight"
    save_file({**renamed, key: torch.full_like(renamed[key], float("inf"))}, str(bare / "adapter_model.safetensors"))
    assert refused(bare) == f"PEFT adapter tensor {key} contains a non-finite value"


def test_an_adapter_for_another_model_is_refused_by_shape(made: Path, tmp_path: Path) -> None:
    document = json.loads((TOY_DIR / "config.json").read_text())
    wider = tmp_path / "wider"
    wider.mkdir()
    (wider / "config.json").write_text(json.dumps({**document, "hidden_size": 128, "head_dim": 32}))
    assert "has shape [2, 64], but rank 2 on this model's q_proj implies [2, 128]" in refused(made, wider)
    (wider / "config.json").write_text(json.dumps({**document, "num_hidden_layers": 2}))
    assert "adapts layer 2, but the model has 2 layers" in refused(made, wider)


def _ster_adapter(tmp_path: Path, reward: bool = False) -> Path:
    config = load_config(TOY_DIR / "config.json")
    adapter = Adapter.fresh(config, 2, 4.0, ["query"], [0, 1], seed=1, device=CPU, reward=reward)
    sidecar = AdapterSidecar(
        kind="reward" if reward else "adapter",
        model="ster:toy",
        rank=2,
        alpha=4.0,
        targets=["query"],
        layers=[0, 1],
        hidden_size=64,
    )
    path = tmp_path / ("r.safetensors" if reward else "a.safetensors")
    save_adapter(path, sidecar, adapter, config)
    return path


def test_export_refuses_a_reward_model_and_a_used_directory_and_writes_nothing(cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = cli("tune", "export-peft", _ster_adapter(tmp_path, reward=True), "--output", out)
    assert run.code != 0 and "adapter artifact is a reward model, not a generation adapter" in run.err
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("x")
    run = cli("tune", "export-peft", _ster_adapter(tmp_path), "--output", out)
    assert run.code != 0 and "already exists and is not empty" in run.err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_export_refuses_factors_that_disagree(cli, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _ster_adapter(tmp_path)
    tensors = load_file(str(path))
    tensors["layers.1.query.b"] = torch.zeros(32, 2)
    save_file(tensors, str(path))
    record_hash(path)  # one defect at a time: not also a pair of two writes
    run = cli("tune", "export-peft", path, "--output", tmp_path / "out")
    assert run.code != 0 and "adapter tensor layers.1.query.b has 32 rows, expected 64" in run.err
    tensors["layers.1.query.b"] = torch.full((64, 2), float("nan"))
    save_file(tensors, str(path))
    record_hash(path)
    run = cli("tune", "export-peft", path, "--output", tmp_path / "out")
    assert run.code != 0 and "adapter tensor layers.1.query.b contains a non-finite value" in run.err
    assert not (tmp_path / "out").exists()


# SmolLM2 ----------------------------------------------------------------------------------------------------


@pytest.mark.real
def test_smollm2_both_ways_equal_peft(cli, smol: Path, tmp_path: Path) -> None:
    config = load_config(smol / "config.json")
    ids = torch.tensor([[1, 504, 3458, 282, 253, 1345, 30, 2, 9, 14990, 42]])
    # Ster → PEFT: random factors on query, value and down over a few layers, exported, loaded by peft.
    adapter = Adapter.fresh(config, 4, 8.0, ["query", "value", "down"], [0, 7, 29], seed=3, device=CPU)
    generator = torch.Generator().manual_seed(4)
    for name, tensor in adapter.tensors.items():
        if name.endswith(".b"):
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.05)
    sidecar = AdapterSidecar(
        model=str(smol),
        rank=4,
        alpha=8.0,
        targets=adapter.targets,
        layers=adapter.layers,
        hidden_size=config.hidden_size,
    )
    save_adapter(tmp_path / "a.safetensors", sidecar, adapter, config)
    run = cli("tune", "export-peft", tmp_path / "a.safetensors", "--output", tmp_path / "out")
    assert run.code == 0, run.err
    source = resolve_model(str(smol))
    decoder = load_decoder(source, config, "f32", CPU)
    with torch.inference_mode():
        base = decoder(ids, vocab="all").logits
        with attached(decoder, adapter):
            ours = decoder(ids, vocab="all").logits
    assert (ours - base).abs().max() > 1e-2
    from peft import LoraConfig, PeftModel, get_peft_model

    reference = PeftModel.from_pretrained(hf_model(smol), str(tmp_path / "out")).eval()
    with torch.inference_mode():
        torch.testing.assert_close(reference(ids).logits, ours, atol=1e-4, rtol=1e-4)
    # PEFT → Ster: peft's random adapter on three projections of every layer, saved, read by Ster.
    torch.manual_seed(5)
    made = get_peft_model(
        reference.unload(),
        LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["k_proj", "o_proj", "up_proj"]),
    ).eval()
    made.save_pretrained(str(tmp_path / "peft"))
    _, theirs = read_peft_dir(tmp_path / "peft", config, CPU)
    with torch.inference_mode(), attached(decoder, theirs):
        got = decoder(ids, vocab="all").logits
    with torch.inference_mode():
        torch.testing.assert_close(got, made(ids).logits, atol=1e-4, rtol=1e-4)
