"""The contract's identity checks and counts on the toy, and the training refusals.

A fresh adapter is the identity, so DPO's first loss is exactly ln 2 (every log-ratio is
zero), IPO's is exactly (1/(2β))², and a reward run's is ln 2 (the head starts at zero).
These are the cheapest checks that the policy pass, the reference pass and the head are
wired correctly; they hold bit for bit, in f32.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from ster.engine.model.adapters.lora import Adapter, attached
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model

LN2_F32 = float(torch.tensor(math.log(2), dtype=torch.float32))
TOY = ["--model", "ster:toy"]


def _train(cli, tmp_path: Path, objective: str, *extra: str, name: str = "a") -> dict:
    out = tmp_path / f"{name}.safetensors"
    data = ["--examples", "ster:examples"] if objective == "sft" else ["--pairs", "ster:pairs"]
    run = cli("tune", objective, *TOY, *data, "--output", out, *extra)
    assert run.code == 0, run.err
    return run.json


def test_a_fresh_adapter_is_the_identity_bit_for_bit() -> None:
    source = resolve_model("ster:toy", None)
    config = load_config(source.config)
    decoder = load_decoder(source, config, "f32", torch.device("cpu"))
    adapter = Adapter.fresh(
        config,
        8,
        16,
        ["query", "key", "value", "output", "gate", "up", "down"],
        list(range(config.num_hidden_layers)),
        7,
        torch.device("cpu"),
    )
    ids = torch.tensor([[1, 55, 18, 54, 32, 8]])
    base = decoder(ids, vocab="all").logits
    with attached(decoder, adapter):
        adapted = decoder(ids, vocab="all").logits
        switched_off = decoder(ids, vocab="all", adapters=False).logits
    assert torch.equal(base, adapted) and torch.equal(base, switched_off)
    assert all(not module.lora for block in decoder.blocks for module in (block.self_attn, block.mlp))


def test_dpo_first_loss_is_exactly_ln2_and_the_counts_match(cli, tmp_path: Path) -> None:
    report = _train(cli, tmp_path, "dpo", "--epochs", "3", "--accumulation", "4", "--learning-rate", "5e-3")["report"]
    assert report["first_loss"] == LN2_F32
    assert (report["trainable_tensors"], report["trainable_parameters"]) == (16, 7168)
    assert report["steps"] == 9  # ceil(12 pairs / 4) x 3 epochs
    assert report["final_loss"] < report["first_loss"] and report["accuracy"] == 1.0
    assert report["mean_reward_margin"] == pytest.approx(report["mean_chosen_reward"] - report["mean_rejected_reward"])


@pytest.mark.parametrize(("beta", "expected"), [("0.1", 25.0), ("0.25", 4.0)])
def test_ipo_first_loss_is_exactly_one_over_two_beta_squared(cli, tmp_path: Path, beta: str, expected: float) -> None:
    report = _train(cli, tmp_path, "dpo", "--loss", "ipo", "--beta", beta)["report"]
    assert report["first_loss"] == expected and report["loss"] == "ipo"


def test_a_one_step_reward_run_ties_every_pair_at_ln2(cli, tmp_path: Path) -> None:
    report = _train(cli, tmp_path, "reward", "--accumulation", "12")["report"]
    assert report["first_loss"] == LN2_F32
    assert (report["trainable_tensors"], report["trainable_parameters"]) == (17, 7232)
    assert report["accuracy"] == 0.0 and report["mean_score_margin"] == 0.0
    assert report["tied_pairs"] == report["trained_pairs"] == 12


def test_the_sidecar_records_the_run_and_travels_with_the_factors(cli, tmp_path: Path) -> None:
    result = _train(cli, tmp_path, "reward", "--epochs", "2", "--learning-rate", "1e-2")
    sidecar = json.loads((tmp_path / "a.json").read_text())
    assert list(sidecar)[:13] == [
        "schema_version",
        "product",
        "kind",
        "model",
        "model_revision",
        "model_fingerprint",
        "rank",
        "alpha",
        "targets",
        "layers",
        "hidden_size",
        "tensors_sha256",
        "train",
    ]
    import hashlib

    assert sidecar["tensors_sha256"] == hashlib.sha256((tmp_path / "a.safetensors").read_bytes()).hexdigest()
    assert (sidecar["kind"], sidecar["rank"], sidecar["alpha"], sidecar["targets"], sidecar["layers"]) == (
        "reward",
        8,
        16.0,
        ["query", "value"],
        [0, 1, 2, 3],
    )
    assert sidecar["train"] == result["report"]
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "a.safetensors"))
    assert tensors["reward.head"].shape == (1, 64) and tensors["layers.0.value.b"].shape == (32, 8)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert tensors["reward.head"].abs().sum() > 0 and tensors["layers.3.query.b"].abs().sum() > 0


def test_only_the_adapter_trains_and_the_shared_decoder_is_left_unadapted(tmp_path: Path) -> None:
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import run_job
    from ster.engine.tune.requests import DpoRequest

    store = ModelStore()
    request = DpoRequest(
        model="ster:toy",
        pairs=Path("ster:pairs"),
        output=tmp_path / "a.safetensors",
        learning_rate=1e-2,
        epochs=2,
        targets="query,key,value,output,gate,up,down",
    )
    events: list = []
    run_job("tune dpo", request, events.append, models=store)
    assert events[-1].type == "result", events[-1]
    (decoder,) = store._decoders.values()
    before = {name: t.clone() for name, t in decoder.state_dict().items()}
    run_job("tune dpo", request.model_copy(update={"output": tmp_path / "b.safetensors"}), events.append, models=store)
    assert all(torch.equal(before[name], t) for name, t in decoder.state_dict().items())
    assert not any(p.requires_grad for p in decoder.parameters())
    assert all(not module.lora for block in decoder.blocks for module in (block.self_attn, block.mlp))


def test_targets_take_every_spelling_and_collapse_repeats(cli, tmp_path: Path) -> None:
    report = _train(cli, tmp_path, "sft", "--targets", " Q_PROJ,v, value,down_proj ", "--layers", "1..3")["report"]
    assert report["targets"] == ["query", "value", "down"] and report["layers"] == [1, 2]
    assert report["trainable_tensors"] == 12


def test_a_long_pair_is_skipped_whole_never_cut(cli, tmp_path: Path) -> None:
    pairs = tmp_path / "p.json"
    pairs.write_text(
        json.dumps(
            {
                "pairs": [
                    {"positive": "the town is calm .", "negative": "the town is flooding and we flee ."},
                    {"positive": "the river is calm .", "negative": "the river is rising ."},
                ]
            }
        )
    )
    run = cli("tune", "dpo", *TOY, "--pairs", pairs, "--output", tmp_path / "a.safetensors", "--max-sequence", "7")
    assert run.code == 0, run.err
    assert "skipping pair 1: 9 tokens exceed the 7 token limit" in run.err
    assert (run.json["report"]["pairs"], run.json["report"]["trained_pairs"], run.json["report"]["skipped_long"]) == (
        2,
        1,
        1,
    )
    run = cli("tune", "dpo", *TOY, "--pairs", pairs, "--output", tmp_path / "b.safetensors", "--max-sequence", "5")
    assert run.code == 1
    assert (
        run.err.splitlines()[-1] == "error: every pair is longer than the sequence limit, so there is nothing "
        "to train on"
    )
    assert not (tmp_path / "b.safetensors").exists()


def test_a_side_of_one_token_is_refused(cli, tmp_path: Path) -> None:
    model = tmp_path / "no-bos"
    shutil.copytree(resolve_model("ster:toy", None).config.parent, model)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    pairs = tmp_path / "p.json"
    pairs.write_text(
        json.dumps(
            {
                "pairs": [
                    {"positive": "the town is calm .", "negative": "the town is calm ."},
                    {"positive": "the river is calm .", "negative": "calm"},
                ]
            }
        )
    )
    run = cli("tune", "dpo", "--model", model, "--pairs", pairs, "--output", tmp_path / "a.safetensors")
    assert (
        run.err.splitlines()[-1] == "error: pair 2 rejected side encodes to one token, so there is nothing to predict"
    )


@pytest.mark.parametrize(
    ("output", "sentence"),
    [
        ("a.json", "--output {tmp}/a.json ends in .json, which is where its sidecar goes"),
        (
            "pairs.safetensors",
            ("the sidecar of --output {tmp}/pairs.safetensors would be {tmp}/pairs.json, the same file as --pairs"),
        ),
    ],
)
def test_the_sidecar_never_lands_on_an_input(cli, tmp_path: Path, output: str, sentence: str) -> None:
    pairs = tmp_path / "pairs.json"
    shutil.copy(resolve_model("ster:toy", None).config.parents[1] / "examples" / "pairs.json", pairs)
    before = pairs.read_bytes()
    run = cli("tune", "dpo", *TOY, "--pairs", pairs, "--output", tmp_path / output)
    assert run.code == 1 and run.err.startswith("error: " + sentence.format(tmp=tmp_path)), run.err
    assert pairs.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["pairs.json"]


def test_a_sidecar_path_holding_another_document_is_not_replaced(cli, tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"prompts": ["keep me"]}))
    run = cli("tune", "sft", *TOY, "--examples", "ster:examples", "--output", tmp_path / "a.safetensors")
    assert run.code == 1 and "already holds a prompt set" in run.err
    assert json.loads((tmp_path / "a.json").read_text()) == {"prompts": ["keep me"]}
    assert not (tmp_path / "a.safetensors").exists()


def test_a_second_run_replaces_its_own_adapter_and_says_so(cli, tmp_path: Path) -> None:
    _train(cli, tmp_path, "sft")
    out = tmp_path / "a.safetensors"
    run = cli("tune", "sft", *TOY, "--examples", "ster:examples", "--output", out, "--seed", "3")
    assert run.code == 0 and f"replacing the LoRA adapter sidecar at {tmp_path / 'a.json'}" in run.err
    assert json.loads((tmp_path / "a.json").read_text())["train"]["seed"] == 3


def test_a_half_precision_run_keeps_factors_and_losses_in_f32(cli, tmp_path: Path) -> None:
    report = _train(cli, tmp_path, "dpo", "--precision", "bf16")["report"]
    assert report["precision"] == "bf16" and report["first_loss"] == LN2_F32
    from safetensors.torch import load_file

    assert all(t.dtype == torch.float32 for t in load_file(str(tmp_path / "a.safetensors")).values())
