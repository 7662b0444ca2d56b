"""``ster.steer`` and ``ster.read`` on a transformers model the caller holds: the same logits as Ster's own steered
decoder, the same states as transformers' own hidden states, and no hook left behind, whatever ends the block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ster
from ster.engine.model.loading import ModelStore
from ster.engine.model.requests import ModelRequest
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.apply import RowEdits
from ster.engine.steering.artifact import load_artifact
from ster.engine.steering.generate import row_plan
from ster.engine.steering.requests import InterventionFields
from ster.engine.steering.strength import Strength
from tests.api.conftest import hooks_on

IDS = torch.tensor([[1, 17, 5, 29, 8, 41, 3, 12], [1, 9, 9, 30, 2, 7, 55, 6]])


def ster_logits(artifact_path: Path, strength: str, **fields: Any) -> torch.Tensor:
    """Logits of Ster's own decoder for the toy, steered as ``ster generate`` steers it."""
    ctx = JobContext(lambda event: None)
    store = ModelStore()
    decoder = store.decoder(store.open(ModelRequest(model="ster:toy"), ctx), ctx)
    artifact = load_artifact(artifact_path)
    plan = row_plan(artifact, InterventionFields(**fields), Strength.model_validate(strength), 4)
    edits = RowEdits.of(decoder, [plan])
    assert edits is not None
    with torch.inference_mode(), edits.applied(decoder):
        return decoder(IDS, vocab="all").logits.float()


@pytest.mark.parametrize(
    ("strength", "fields"),
    [
        ("0.8x", {}),
        ("-3", {"layers": "1..2"}),
        ("1", {"mode": "ablate"}),
        ("0.5x", {"mode": "clamp", "layers": "2,3", "peak_layer": 2, "falloff": 2}),
    ],
)
def test_steering_transformers_own_model_gives_sters_steered_logits(
    hf_toy: Any, fitted: Path, strength: str, fields: dict[str, Any]
) -> None:
    with torch.inference_mode():
        plain = hf_toy(IDS).logits
        with ster.steer(hf_toy, fitted, strength=strength, **fields):
            steered = hf_toy(IDS).logits
        after = hf_toy(IDS).logits
    expected = ster_logits(fitted, strength, **fields)
    assert (steered - plain).abs().max() > 0.05  # it steers
    torch.testing.assert_close(steered, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(after, plain, atol=0, rtol=0)
    assert hooks_on(hf_toy) == 0


def test_generate_inside_the_block_is_steered_and_takes_the_artifact_object(hf_toy: Any, fitted: Path) -> None:
    artifact = ster.load_artifact(fitted)
    prompt = IDS[:1]
    with torch.inference_mode():
        plain = hf_toy.generate(prompt, max_new_tokens=8, do_sample=False)
        with ster.steer(hf_toy, artifact, strength="1.5x"):
            steered = hf_toy.generate(prompt, max_new_tokens=8, do_sample=False)
    assert not torch.equal(plain, steered)
    assert hooks_on(hf_toy) == 0


def test_every_hook_is_removed_after_an_exception_and_the_model_is_left_as_it_was(hf_toy: Any, fitted: Path) -> None:
    state = {name: tensor.clone() for name, tensor in hf_toy.state_dict().items()}
    modules = {name: sorted(vars(module)) for name, module in hf_toy.named_modules()}
    with pytest.raises(RuntimeError, match="inside the block"), ster.steer(hf_toy, fitted, mode="ablate"):
        assert hooks_on(hf_toy) > 0
        raise RuntimeError("inside the block")
    assert hooks_on(hf_toy) == 0
    with pytest.raises(KeyboardInterrupt), ster.steer(hf_toy, fitted):
        raise KeyboardInterrupt
    assert hooks_on(hf_toy) == 0
    assert {name: sorted(vars(module)) for name, module in hf_toy.named_modules()} == modules
    assert all(torch.equal(tensor, state[name]) for name, tensor in hf_toy.state_dict().items())
    assert hf_toy.training is False and all(p.requires_grad for p in hf_toy.parameters())


def test_an_artifact_of_another_width_or_depth_is_refused_before_any_hook(fitted: Path, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=64, intermediate_size=32, num_attention_heads=2, num_key_value_heads=2)
    wider = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=4, **small))
    with pytest.raises(ster.SterError, match="^artifact width 64 does not match the width 32 of the model you passed$"):
        with ster.steer(wider, fitted):
            pass
    shallow = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, **small))
    with pytest.raises(ster.SterError, match=r"has a vector for layer 2, but the model you passed has layers 0\.\.1"):
        with ster.steer(shallow, fitted):
            pass
    assert hooks_on(wider) == hooks_on(shallow) == 0
    with pytest.raises(ster.SterError, match="expected a transformers causal language model"):
        with ster.steer(object(), fitted):
            pass
    with pytest.raises(ster.SterError, match="strength"):
        with ster.steer(shallow, fitted, strength="very"):
            pass
    with pytest.raises(ster.SterError, match="--mode"):
        with ster.steer(shallow, fitted, mode="push"):  # type: ignore[arg-type]
            pass


def test_a_family_without_a_native_decoder_is_steered_through_its_layers(fitted: Path) -> None:
    """GPT-2 (layers named h, a tuple out of each block): the same addition as hooks written by hand."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=4, n_head=2, vocab_size=64, n_positions=32)).eval()
    artifact = ster.load_artifact(fitted)
    added = {v.layer: torch.tensor(v.vector) * 2.0 for v in artifact.vectors}

    def adding(layer: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            hidden = output[0] if isinstance(output, tuple) else output
            return (hidden + added[layer], *output[1:]) if isinstance(output, tuple) else hidden + added[layer]

        return hook

    ids = IDS % 64
    with torch.inference_mode():
        handles = [model.transformer.h[layer].register_forward_hook(adding(layer)) for layer in added]
        by_hand = model(ids).logits
        for handle in handles:
            handle.remove()
        with ster.steer(model, artifact, strength=2):
            ours = model(ids).logits
    torch.testing.assert_close(ours, by_hand, atol=1e-5, rtol=0)
    assert hooks_on(model) == 0


def test_read_gives_transformers_own_hidden_states_at_each_texts_last_token(hf_toy: Any) -> None:
    from transformers import AutoTokenizer

    from ster.engine.model.resolve import TOY_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(TOY_DIR))
    assert hooks_on(hf_toy) == 0
    texts = ["the sea is", "question : what color is the sky ? answer :", "hello"]
    states = ster.read(hf_toy, texts, tokenizer=tokenizer, layers=[0, 2], batch_size=2)
    assert sorted(states) == [0, 2] and states[0].shape == (3, 64) and states[0].dtype == torch.float32
    with torch.inference_mode():
        for row, text in enumerate(texts):
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            hidden = hf_toy(ids, output_hidden_states=True).hidden_states  # [embeddings, after block 0, ...]
            for layer in (0, 2):
                torch.testing.assert_close(states[layer][row], hidden[layer + 1][0, -1], atol=1e-5, rtol=0)
    present = hooks_on(hf_toy)  # (transformers keeps hooks of its own once hidden states were asked for)
    every = ster.read(hf_toy, [[1, 5, 7]])
    assert sorted(every) == [0, 1, 2, 3]
    with pytest.raises(ster.SterError, match="tokenizer"):
        ster.read(hf_toy, ["no tokenizer given"])
    with pytest.raises(ster.SterError, match=r"0\.\.3"):
        ster.read(hf_toy, [[1, 2]], layers=[7])
    assert hooks_on(hf_toy) == present
