"""``ster model import`` on a GGUF of each native family, written by the tests from a tiny transformers model.

Each file is written the way a GGUF lays its family out (``tests/model/gguf_files.py``: llama.cpp's tensor
names, Llama's q/k row order, Gemma's ``1 + w`` norms, the shape as metadata, a byte-level BPE vocabulary) at
f32, and imported through the CLI. The imported checkpoint must be the original model: its weights equal the
original's, and Ster's logits equal the original's and those of transformers' own model read from the same GGUF
(an independent reading of the file), to 1e-4. Where transformers' reader alone builds the config wrongly (a
setting the header states that it leaves at the class's default), it is given the imported config.json and the
test records what it got wrong.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from ster.cli import main
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from tests.model.gguf_files import CHAT_TEMPLATE, END_OF_TURN, EOS, FAMILIES, vocabulary, write_family_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

TOLERANCE = 1e-4
ROWS = [[0, 14, 20, 33, 41, 52, 60, 71, 80, 90, 17], [0, 22, 35, 47], [5, 9, 13, 17, 21, 25, 29, 269]]
"""Three sequences, two longer than Gemma's window."""
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma3": "gemma3_text",
}
"""What each family imports as: a Mistral GGUF is a llama one."""
READER_MISSES = {
    "llama": ("attention_bias", "mlp_bias", "rope_parameters"),
    "qwen3": ("head_dim", "attention_bias"),
    "phi3": ("rope_parameters",),
    "gemma3": ("query_pre_attn_scalar", "rope_parameters"),
}
"""The settings transformers' GGUF reader alone leaves at its config class's defaults although the header states
them (Llama's biases and linear rope scaling, Qwen 3's head width and biases, Phi-3's rotating share, Gemma 3's
score scale and rope scaling); the import completes them."""


def run_import(source: Path, output: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["model", "import", str(source), "--output", str(output)])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module", params=list(FAMILIES))
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(family, GGUF path, the original model, the import's exit code, stdout and stderr, the imported directory)."""
    where = tmp_path_factory.mktemp(request.param)
    source, original = write_family_gguf(where, request.param)
    code, out, err = run_import(source, where / "imported")
    return request.param, source, original, code, out, err, where / "imported"


def ster_logits(directory: Path) -> list[torch.Tensor]:
    source = resolve_model(str(directory))
    decoder = load_decoder(source, load_config(source.config), "f32", torch.device("cpu"))
    with torch.inference_mode():
        return [decoder(torch.tensor([row]), vocab="all").logits[0] for row in ROWS]


def hf_logits(model: torch.nn.Module) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(torch.tensor([row])).logits[0] for row in ROWS]


def read_gguf_with_transformers(source: Path, config=None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    extra = {} if config is None else {"config": config}
    return AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32, attn_implementation="eager", **extra
    ).eval()


def assert_close(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.shape == other.shape and (mine - other).abs().max().item() <= TOLERANCE


def test_the_import_succeeds_as_the_family(imported) -> None:
    family, _, original, code, out, err, directory = imported
    assert code == 0, err
    result = json.loads(out)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPES[family] and "quantization_config" not in config
    assert result["num_hidden_layers"] == original.config.num_hidden_layers
    assert result["vocab_size"] == len(vocabulary()) and result["chat_template"] is True
    assert config["tie_word_embeddings"] is original.config.tie_word_embeddings
    assert config["eos_token_id"] == [EOS, END_OF_TURN]  # the vocabulary's <end_of_turn> stops generation too
    assert json.loads((directory / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_the_tokenizer_applies_the_files_merges(imported) -> None:
    from tokenizers import Tokenizer

    *_, directory = imported
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokens = vocabulary()
    assert tokenizer.encode(" the river sea", add_special_tokens=False).ids == [
        tokens.index("Ġthe"),
        tokens.index("Ġriver"),
        tokens.index("Ġsea"),
    ]


def test_the_original_weights_are_recovered(imported) -> None:
    from safetensors.torch import load_file

    family, _, original, *_, directory = imported
    written = load_file(str(directory / "model.safetensors"))
    expected = {
        name: tensor
        for name, tensor in original.state_dict().items()
        if not (name == "lm_head.weight" and original.config.tie_word_embeddings)
    }
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():  # Gemma's norms come back through 1 + w at f32, so within rounding
        assert torch.allclose(written[name], tensor, rtol=0, atol=1e-6 if family == "gemma3" else 0), name


def test_ster_equals_the_original_model(imported) -> None:
    *_, directory = imported
    assert_close(ster_logits(directory), hf_logits(imported[2]))


def test_ster_equals_transformers_reading_the_same_gguf(imported) -> None:
    from transformers import AutoConfig

    family, source, original, *_, directory = imported
    ours = ster_logits(directory)
    if family not in READER_MISSES:
        assert_close(ours, hf_logits(read_gguf_with_transformers(source)))
        return
    misread = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    for setting in READER_MISSES[family]:
        assert getattr(misread, setting, None) != getattr(original.config, setting), setting
    completed = AutoConfig.from_pretrained(str(directory))
    assert_close(ours, hf_logits(read_gguf_with_transformers(source, completed)))


def test_a_llama_file_named_mistral_imports_as_llama(tmp_path: Path) -> None:
    """transformers' reader makes a llama GGUF whose general.name is "mistral" a Mistral config, then finds no
    ``mistral`` architecture in the gguf package to name its tensors by; llama.cpp runs the file as Llama, and so
    does the import."""
    source, original = write_family_gguf(tmp_path, "mistral", name="mistral")
    code, _, err = run_import(source, tmp_path / "imported")
    assert code == 0, err
    assert json.loads((tmp_path / "imported" / "config.json").read_text())["model_type"] == "llama"
    assert_close(ster_logits(tmp_path / "imported"), hf_logits(original))


def test_llama_3_rope_scaling_comes_back_from_its_rope_divisors(tmp_path: Path) -> None:
    """llama.cpp writes Llama 3.1's and 3.2's rope scaling as per-frequency divisors (``rope_freqs.weight``), which
    transformers' reader drops; the import finds the setting that reproduces them and writes it back."""
    import math

    import numpy as np
    import transformers

    from tests.model.gguf_files import COMMON as TINY
    from tests.model.gguf_files import write_gguf

    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }
    config = transformers.LlamaConfig(**{**TINY, "head_dim": 16, "tie_word_embeddings": False, "rope_parameters": rope})
    torch.manual_seed(0)
    original = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in original.named_parameters():
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + torch.randn(param.shape) * 0.1)
    divisors = []  # llama.cpp's rule: 1 above the high-frequency wavelength, the factor below the low one
    for i in range(0, 16, 2):
        wavelength = 2 * math.pi * 500000.0 ** (i / 16)
        smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
        divisors.append(
            1.0 if wavelength < 8192 / 4.0 else 8.0 if wavelength > 8192 / 1.0 else 1 / ((1 - smooth) / 8.0 + smooth)
        )
    assert len(set(divisors)) == 3  # every regime present: kept, divided, interpolated
    source = write_gguf(
        tmp_path / "llama3.gguf", original, "llama", tensors={"rope_freqs.weight": np.array(divisors, dtype=np.float32)}
    )
    code, _, err = run_import(source, tmp_path / "imported")
    assert code == 0, err
    scaling = json.loads((tmp_path / "imported" / "config.json").read_text())["rope_scaling"]
    assert {key: scaling[key] for key in ("rope_type", "factor", "original_max_position_embeddings")} == {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
    }
    assert_close(ster_logits(tmp_path / "imported"), hf_logits(original))
