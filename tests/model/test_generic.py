"""Causal LMs of families Ster has no decoder for, run through transformers' own model (ster/engine/model/generic.py).

The numeric checks of the family table (logits, block outputs, padding, the cache, packed reads,
steering, identity and merged adapters) run on Gemma 2 in tests/model/test_families.py. Here: that
such a model is recognised and said to be slower once, decodes as transformers' ``generate`` does,
trains a direction and an adapter through the CLI, exports that adapter for PEFT with the same
logits, and that a model with other layer names (GPT-2) is steered while a LoRA target it lacks is
refused by name; a checkpoint that is not a causal LM is refused before its weights are read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ster.engine.model.adapters.lora import attached, load_adapter
from ster.engine.model.config import load_config
from ster.engine.model.decoder import SterDecoder
from ster.engine.model.decoding import decode
from ster.engine.model.generic import GenericDecoder
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import TOY_DIR, resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.steering.apply import steer
from tests.model.test_families import COMMON, ROWS, build

DATA = Path(__file__).resolve().parents[1] / "data"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build("gemma2", tmp_path_factory.mktemp("gemma2"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """GPT-2: absolute positions, fused ``c_attn`` Conv1D projections, ``transformer.h`` layers."""
    import transformers

    where = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(
        vocab_size=104, n_embd=48, n_layer=3, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).float().eval()
    model.save_pretrained(where)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOY_DIR / name, where / name)
    return where, model


def loaded(path: Path):
    source = resolve_model(str(path))
    return load_decoder(source, load_config(source.config), "f32", CPU)


def test_a_family_without_a_native_decoder_runs_through_transformers(gemma2) -> None:
    path, _ = gemma2
    config = load_config(path / "config.json")
    assert (config.model_type, config.native, config.num_hidden_layers, config.hidden_size) == ("gemma2", False, 3, 48)
    assert isinstance(loaded(path), GenericDecoder)
    assert isinstance(loaded(TOY_DIR), SterDecoder)


def test_greedy_decoding_equals_transformers_generate(gemma2) -> None:
    path, reference = gemma2
    decoder = loaded(path)
    prompt = ROWS[0][:6]
    ours = decode(
        decoder,
        prompt,
        max_new_tokens=12,
        sampling=Sampling(temperature=0.0),
        eos_ids=frozenset(),
        on_token=lambda i, t: None,
        check_cancelled=lambda: None,
    )
    with torch.no_grad():
        theirs = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=3
        )
    assert ours.ids == theirs[0, len(prompt) :].tolist()
    group = decode_group(
        decoder,
        prompt,
        [Sampling(temperature=0.0)] * 3,
        max_new_tokens=12,
        eos_ids=frozenset(),
        check_cancelled=lambda: None,
    )
    assert [g.ids for g in group] == [ours.ids] * 3  # a shared prefill repeated into every row's cache


def test_sampled_rows_that_stop_leave_the_cache_and_the_rest_equal_their_runs_alone(gemma2) -> None:
    """The group decoder drops stopped rows from transformers' DynamicCache; the rows left go on as alone."""
    decoder = loaded(gemma2[0])
    prompt = ROWS[0][:6]
    samplings = [Sampling(temperature=1.5, seed=100 + i) for i in range(6)]

    def alone(sampling: Sampling, eos: frozenset[int]):
        return decode(
            decoder,
            prompt,
            max_new_tokens=12,
            sampling=sampling,
            eos_ids=eos,
            on_token=lambda i, t: None,
            check_cancelled=lambda: None,
        )

    free = [alone(s, frozenset()) for s in samplings]
    common = min({t for g in free for t in g.ids}, key=lambda t: abs(sum(t in g.ids for g in free) - 3))
    eos = frozenset({common})
    rows = decode_group(decoder, prompt, samplings, max_new_tokens=12, eos_ids=eos, check_cancelled=lambda: None)
    assert rows == [alone(s, eos) for s in samplings]
    assert {g.stop_reason for g in rows} == {"eos", "max_new_tokens"}


def test_the_cli_says_once_that_the_model_runs_through_transformers(cli, gemma2, tmp_path: Path) -> None:
    path, _ = gemma2
    run = cli("generate", "--model", path, "--prompt", "the sea is", "--max-new-tokens", "3")
    assert run.code == 0, run.err
    assert run.err.count("runs through transformers' model") == 1
    assert 'model_type "gemma2" has no decoder of Ster\'s own' in run.err
    run = cli("generate", "--model", path, "--prompt", "the sea is", "--max-new-tokens", "3", "--precision", "int8")
    assert run.code == 1 and "--precision int8 runs on Ster's own decoders only" in run.err


def test_a_direction_and_an_adapter_train_and_the_adapter_exports_to_peft(cli, gemma2, tmp_path: Path) -> None:
    """train → generate steered; tune sft → the adapter changes the logits, and PEFT on transformers' own model
    with ``tune export-peft``'s directory gives Ster's logits with the adapter attached."""
    from peft import PeftModel

    path, reference = gemma2
    vector = tmp_path / "calm.json"
    run = cli("train", "--model", path, "--pairs", DATA / "calm-fit.json", "--output", vector, "--layers", "1")
    assert run.code == 0, run.err
    plain = cli("generate", "--model", path, "--prompt", "the sea is", "--max-new-tokens", "6", "--temperature", "0")
    steered = cli(
        "generate",
        "--model",
        path,
        "--prompt",
        "the sea is",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
        "--vector",
        vector,
        "--strength=-40x",
    )  # (this random model's text hardly moves)
    assert plain.code == steered.code == 0, steered.err
    assert steered.json["text"] != plain.json["text"]
    adapter = tmp_path / "a.safetensors"
    run = cli(
        "tune",
        "sft",
        "--model",
        path,
        "--examples",
        "ster:examples",
        "--output",
        adapter,
        "--rank",
        "2",
        "--targets",
        "query,key,value,output,gate,up,down",
        "--learning-rate",
        "0.05",
        "--epochs",
        "1",
    )
    assert run.code == 0, run.err
    decoder = loaded(path)
    _, trained = load_adapter(adapter, decoder.config, CPU)
    ids = torch.tensor([ROWS[0]])
    with torch.inference_mode():
        base = decoder(ids, vocab="all").logits
        with attached(decoder, trained):
            ours = decoder(ids, vocab="all").logits
    assert (ours - base).abs().max() > 1e-3
    out = tmp_path / "peft"
    assert cli("tune", "export-peft", adapter, "--output", out).code == 0
    with torch.no_grad():
        theirs = PeftModel.from_pretrained(reference, str(out)).eval()(ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_dpo_and_grpo_run_through_transformers(cli, gemma2, tmp_path: Path) -> None:
    """DPO scores its reference with the factors switched off inside the same model; GRPO samples groups (folded
    or attached factors) and steps: both from the first loss the objectives promise."""
    path, _ = gemma2
    run = cli(
        "--json",
        "tune",
        "dpo",
        "--model",
        path,
        "--pairs",
        DATA / "calm-fit.json",
        "--output",
        tmp_path / "dpo.safetensors",
        "--learning-rate",
        "5e-3",
        "--accumulation",
        "4",
    )
    assert run.code == 0, run.err
    report = run.events[-1]["data"]["report"]
    assert abs(report["first_loss"] - 0.6931) < 1e-3  # -log sigmoid(0): the adapter starts as the reference
    run = cli(
        "--json",
        "tune",
        "grpo",
        "--model",
        path,
        "--prompts",
        "ster:grpo-prompts",
        "--max-new-tokens",
        "6",
        "--iterations",
        "1",
        "--accumulation",
        "2",
        "--output",
        tmp_path / "grpo.safetensors",
    )
    assert run.code == 0, run.err
    report = run.events[-1]["data"]["report"]
    assert report["first_loss"] == 0.0 and report["steps"] == 3


def test_other_layer_names_are_read_and_steered_and_a_missing_target_is_refused(cli, gpt2, tmp_path: Path) -> None:
    path, reference = gpt2
    decoder = loaded(path)
    ids = torch.tensor([ROWS[0]])
    with torch.inference_mode():
        out = decoder(ids, vocab="all")
        assert torch.allclose(out.logits[0], reference(ids).logits[0], atol=1e-4)
        with steer(decoder, {1: torch.randn(48, generator=torch.Generator().manual_seed(1))}):  # (a constant
            # vector would vanish in the next LayerNorm)
            moved = decoder(ids, vocab="all").logits
    assert (moved - out.logits).abs().max() > 1e-3
    run = cli("tune", "sft", "--model", path, "--examples", "ster:examples", "--output", tmp_path / "a.safetensors")
    assert run.code == 1 and "Traceback" not in run.err
    assert "this gpt2 model's layers have no self_attn.q_proj linear projection" in run.err
    assert not (tmp_path / "a.safetensors").exists()


def test_weights_that_do_not_fit_the_config_are_refused_not_filled_in(cli, gemma2, tmp_path: Path) -> None:
    """transformers would draw a missing weight at random and only log it; Ster names it instead."""
    from safetensors.torch import load_file, save_file

    path, _ = gemma2
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    run = cli("generate", "--model", broken, "--prompt", "the sea is", "--max-new-tokens", "1")
    assert run.code == 1 and "Traceback" not in run.err
    assert f"the weights in {broken} have no tensor model.layers.1.mlp.down_proj.weight" in run.err
    other = tmp_path / "other"  # the toy's Llama weights under a GPT-NeoX config: shapes that cannot load
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        shutil.copyfile(TOY_DIR / name, other.mkdir(exist_ok=True) or other / name)
    (other / "config.json").write_text(
        json.dumps({**COMMON, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]})
    )
    run = cli("generate", "--model", other, "--prompt", "the sea is", "--max-new-tokens", "1")
    assert run.code == 1 and "Traceback" not in run.err and len(run.err.strip().splitlines()[-1]) < 400
