"""The ``model import`` job: a GGUF checkpoint of a native family converted into a standard directory.

The GGUF header is read first, so a file of another family is refused before a
tensor is dequantized or a file written. Dequantizing and rebuilding the tokenizer
is done by transformers' own GGUF reader (which needs the ``gguf`` package); the
directory is written beside its destination, checked the way every command checks a
checkpoint, and only then renamed into place.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any
from unittest import mock

from pydantic import BaseModel

from ster.engine.model.config import check_architecture, load_config
from ster.engine.model.loading import load_decoder, resolve_device
from ster.engine.model.requests import ModelImportRequest
from ster.engine.model.resolve import resolve_model
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import (
    atomic_directory,
    check_output_directory,
    dumps_pretty,
    write_atomic,
)
from ster.engine.protocol.jobs import JobContext

GGUF_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3")
"""The GGUF architectures ``model import`` converts: the families Ster runs natively (a Gemma 3 GGUF holds the
text model, written as ``gemma3_text``). Any other architecture is refused from the header."""


class ImportResult(BaseModel):
    """What ``ster model import`` prints."""

    output: str
    source: str
    name: str | None
    files: list[str]
    tensors: int
    parameters: int
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    chat_template: bool
    """Whether the GGUF carried a chat template (written to tokenizer_config.json)."""


def read_architecture(path: Path) -> tuple[str, str | None]:
    """The GGUF's ``general.architecture`` and ``general.name``, from its header alone."""
    try:
        import gguf
    except ImportError:
        raise Refusal('importing GGUF needs the gguf and accelerate packages: pip install "ster[gguf]"') from None
    try:
        fields = gguf.GGUFReader(str(path)).fields
    except Exception as exc:  # the reader raises ValueError, struct.error and others for a non-GGUF file
        raise Refusal(f"{path} is not a readable GGUF file: {exc}") from None
    if "general.architecture" not in fields:
        raise Refusal(f"{path} declares no general.architecture")
    name = fields["general.name"].contents() if "general.name" in fields else None
    return str(fields["general.architecture"].contents()), name


def import_job(request: ModelImportRequest, ctx: JobContext) -> ImportResult:
    source = request.gguf
    if not source.is_file():
        raise Refusal(f"GGUF file {source} does not exist")
    check_output_directory(request.output)
    ctx.progress("read", f"reading the header of {source}")
    architecture, name = read_architecture(source)
    check_architecture(architecture, str(source), GGUF_MODEL_TYPES)
    ctx.progress("dequantize", "dequantizing tensors and rebuilding the tokenizer (transformers' GGUF reader)")
    model, tokenizer = _load_with_transformers(source)
    ctx.check_cancelled()
    with atomic_directory(request.output) as staging:
        ctx.progress("write", f"writing the checkpoint to {request.output}")
        tensors, parameters = _write_checkpoint(staging, model, tokenizer)
        ctx.progress("verify", "checking the written checkpoint loads")
        checkpoint = resolve_model(str(staging))
        config = load_config(checkpoint.config)
        load_decoder(checkpoint, config, "f32", resolve_device("cpu"))
        ctx.check_cancelled()
    return ImportResult(
        output=str(request.output), source=str(source), name=name,
        files=sorted(p.name for p in request.output.iterdir()), tensors=tensors, parameters=parameters,
        num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size, vocab_size=config.vocab_size,
        chat_template=bool(tokenizer.chat_template),
    )


def _load_with_transformers(path: Path) -> tuple[Any, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # The dequantizer draws its own tqdm bar on stderr, ignoring the switch above; stdout
    # and stderr belong to the front end, so the bar is swapped for a plain iteration.
    with mock.patch.object(gguf_utils, "tqdm", lambda iterable, **kwargs: iterable), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        except ImportError as exc:
            raise Refusal(f'importing GGUF needs the gguf and accelerate packages: {exc}') from None
        except (ValueError, KeyError, RuntimeError) as exc:
            raise Refusal(f"transformers could not read {path}: {exc}") from None
    return model, tokenizer


def _write_checkpoint(directory: Path, model: Any, tokenizer: Any) -> tuple[int, int]:
    """Write config, tokenizer files and weights; return (tensor count, parameter count)."""
    from safetensors.torch import save_file

    config = _config_document(model.config)
    write_atomic(directory / "config.json", dumps_pretty(config))
    tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
    write_atomic(directory / "tokenizer_config.json", dumps_pretty(_tokenizer_config(tokenizer, config)))
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return len(state), sum(tensor.numel() for tensor in state.values())


def _config_document(config: Any) -> dict[str, Any]:
    """config.json of the imported model: a classic Llama one for Llama (readable by transformers 4.x and 5.x
    alike, and fingerprinted as before other families ran), the family's own config class's document otherwise."""
    if config.model_type != "llama":
        return _family_document(config)
    rope = getattr(config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = rope if rope.get("rope_type", "default") != "default" else getattr(config, "rope_scaling", None)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "attention_bias": bool(getattr(config, "attention_bias", False)),
        "mlp_bias": bool(getattr(config, "mlp_bias", False)),
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "torch_dtype": "float32",
    }


_NOT_WRITTEN = ("quantization_config", "_name_or_path", "transformers_version", "dtype", "torch_dtype", "use_cache")


def _family_document(config: Any) -> dict[str, Any]:
    """The config transformers built from the GGUF's header, as its own class writes it, less what described the
    GGUF file (its quantization) rather than the model; the weights are written at f32."""
    from transformers import PretrainedConfig

    generic = PretrainedConfig().to_dict()  # the settings every config carries (labels, output switches)
    document = {name: value for name, value in config.to_dict().items()
                if name not in _NOT_WRITTEN and not (name in generic and generic[name] == value)}
    document["architectures"] = [type(config).__name__.replace("Config", "ForCausalLM")]
    document["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", False))
    document["torch_dtype"] = "float32"
    return document


def _tokenizer_config(tokenizer: Any, config: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                "model_max_length": config["max_position_embeddings"]}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, str):
            document[name] = value
    if tokenizer.chat_template:
        document["chat_template"] = tokenizer.chat_template
    return document
