"""The ``model import`` job: a GGUF checkpoint of a native family converted into a standard directory.

The GGUF header is read first, so a file of another family, or one whose rope scaling
cannot be rebuilt, is refused before a tensor is dequantized or a file written.
Dequantizing and rebuilding the tokenizer is done by transformers' own GGUF reader
(which needs the ``gguf`` package), on a config completed from the header where that
reader leaves a stated setting out (:func:`_complete_config`); a file whose tensors the
reader does not all place is refused. The directory is written beside its
destination, checked the way every command checks a checkpoint, and only then
renamed into place.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple, cast
from unittest import mock

from pydantic import BaseModel

from ster.engine.model.config import check_architecture, load_config
from ster.engine.model.loading import load_decoder, resolve_device
from ster.engine.model.requests import ModelImportRequest
from ster.engine.model.resolve import resolve_model
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal, first_sentence
from ster.engine.protocol.files import atomic_directory, check_output_directory, dumps_pretty, write_atomic
from ster.engine.protocol.jobs import JobContext

GGUF_MODEL_TYPES = ("llama", "qwen2", "qwen3", "phi3", "gemma3")
"""The GGUF architectures ``model import`` converts: the families Ster runs natively (a Gemma 3 GGUF holds the
text model, written as ``gemma3_text``). Any other architecture is refused from the header. A Mistral model is a
``llama`` GGUF (llama.cpp writes it so, and the ``gguf`` package names no ``mistral`` architecture) and imports as
Llama."""

END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>")
"""The end-of-turn tokens of the native families' chat templates (Gemma, Qwen, Llama 3, Phi-3): a GGUF names one
stop id, and where its vocabulary holds one of these as a special token, generation stops there too (as llama.cpp
does)."""


class GgufHeader(NamedTuple):
    """What the import reads before any tensor: the architecture, the metadata fields, the tensor names."""

    architecture: str
    name: str | None
    fields: Any
    """The reader's fields, read on demand (a vocabulary can hold 200 000 strings)."""
    tensors: frozenset[str]
    rope_freqs: tuple[float, ...] | None = None
    """A Llama GGUF's per-frequency rope divisors (``rope_freqs.weight``: llama.cpp's form of Llama 3's scaling)."""

    def value(self, key: str) -> Any:
        return self.fields[key].contents() if key in self.fields else None


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


def read_header(path: Path) -> GgufHeader:
    """The GGUF's architecture, name, fields and tensor names, from its header alone (tensors are mapped, not read)."""
    try:
        import gguf
    except ImportError:
        raise Refusal('importing GGUF needs the gguf and accelerate packages: pip install "ster[gguf]"') from None
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, struct.error and others for a non-GGUF file
        raise Refusal(f"{path} is not a readable GGUF file: {first_sentence(exc)}") from None
    fields = reader.fields
    if "general.architecture" not in fields:
        raise Refusal(f"{path} declares no general.architecture")
    name = fields["general.name"].contents() if "general.name" in fields else None
    tensors = frozenset(tensor.name for tensor in reader.tensors)
    freqs = next(
        (
            tuple(float(x) for x in tensor.data.reshape(-1))
            for tensor in reader.tensors
            if tensor.name == "rope_freqs.weight"
        ),
        None,
    )
    return GgufHeader(str(fields["general.architecture"].contents()), name, fields, tensors, freqs)


def check_header(header: GgufHeader, where: str) -> None:
    """Refuse, before anything is read, a family Ster does not convert and rope scaling the import cannot rebuild."""
    check_architecture(header.architecture, where, GGUF_MODEL_TYPES)
    factors = sorted(name for name in header.tensors if name.startswith(("rope_freqs", "rope_factors")))
    if factors == ["rope_freqs.weight"] and header.architecture == "llama" and llama3_scaling(header) is not None:
        factors = []  # Llama 3.1's and 3.2's scaling, written back as rope_scaling "llama3"
    if factors:
        raise Refusal(
            f"{where} scales its rope by per-frequency factors ({factors[0]}) that Llama 3's rope scaling "
            "does not reproduce, which neither transformers' GGUF reader nor Ster rebuilds"
        )
    scaling = header.value(f"{header.architecture}.rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise Refusal(
            f'{where} uses rope scaling "{scaling}"; Ster imports GGUF files with linear rope scaling or none'
        )


def import_job(request: ModelImportRequest, ctx: JobContext) -> ImportResult:
    source = confine.readable(request.gguf)  # under a server's root: walked inside it and pinned
    if source.is_dir():
        raise Refusal(f"GGUF file {request.gguf} is a directory; give the .gguf file itself")
    if not source.is_file():
        raise Refusal(f"GGUF file {source} does not exist")
    check_output_directory(request.output)
    ctx.progress("read", f"reading the header of {source}")
    header = read_header(source)
    check_header(header, str(source))
    ctx.progress("dequantize", "dequantizing tensors and rebuilding the tokenizer (transformers' GGUF reader)")
    model, tokenizer = _load_with_transformers(source, header)
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
        output=str(request.output),
        source=str(source),
        name=header.name,
        files=sorted(p.name for p in request.output.iterdir()),
        tensors=tensors,
        parameters=parameters,
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        chat_template=bool(tokenizer.chat_template),
    )


def _load_with_transformers(path: Path, header: GgufHeader) -> tuple[Any, Any]:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # The dequantizer draws its own tqdm bar on stderr, ignoring the switch above; stdout
    # and stderr belong to the front end, so the bar is swapped for a plain iteration.
    with mock.patch.object(gguf_utils, "tqdm", lambda iterable, **kwargs: iterable), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            config = _complete_config(
                AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name), header, tokenizer
            )
            model, info = cast(
                tuple[Any, dict[str, Any]],
                AutoModelForCausalLM.from_pretrained(
                    str(path.parent),
                    gguf_file=path.name,
                    config=config,
                    dtype=torch.float32,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                ),
            )  # reported below, in a sentence, instead of in a logged table
        except ImportError as exc:
            raise Refusal(f"importing GGUF needs the gguf and accelerate packages: {first_sentence(exc)}") from None
        except (ValueError, KeyError, RuntimeError, TypeError, IndexError, AttributeError) as exc:
            raise Refusal(f"transformers could not read {path}: {first_sentence(exc)}") from None
    _check_all_read(path, header, model, info)
    return model, tokenizer


def _complete_config(config: Any, header: GgufHeader, tokenizer: Any) -> Any:
    """Settings the header states that transformers' reader leaves at the config class's defaults, read as
    llama.cpp reads them: the head width, the rotating share of a Phi-3 head, Gemma 3's score scale, linear rope
    scaling, Llama's and Qwen 3's biases, and the end-of-turn stop ids."""
    arch = header.architecture
    if arch == "llama" and config.model_type != "llama":  # transformers' reader makes a file named "mistral" one
        from transformers import LlamaConfig

        config = LlamaConfig(**{name: value for name, value in config.to_dict().items() if name != "model_type"})
    key_length = header.value(f"{arch}.attention.key_length")
    if key_length is not None and hasattr(config, "head_dim"):
        config.head_dim = int(key_length)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = (
        config.rope_parameters.get("full_attention", config.rope_parameters)
        if arch == "gemma3"
        else config.rope_parameters
    )
    rotating = header.value(f"{arch}.rope.dimension_count")
    if arch == "phi3" and rotating is not None and int(rotating) != head_dim:
        rope["partial_rotary_factor"] = int(rotating) / head_dim
    if header.value(f"{arch}.rope.scaling.type") == "linear":
        rope.update(rope_type="linear", factor=float(header.value(f"{arch}.rope.scaling.factor")))
    llama3 = llama3_scaling(header) if arch == "llama" else None
    if llama3 is not None:
        rope.update(llama3)
    if arch == "gemma3":  # llama.cpp: 1/sqrt(head_dim), but 1/sqrt(hidden/heads) for the 62-layer 27B
        config.query_pre_attn_scalar = (
            config.hidden_size // config.num_attention_heads if config.num_hidden_layers == 62 else head_dim
        )
    if arch in ("llama", "qwen3"):
        config.attention_bias = "blk.0.attn_q.bias" in header.tensors
    if arch == "llama":
        config.mlp_bias = "blk.0.ffn_up.bias" in header.tensors
    config.eos_token_id = _stop_ids(config.eos_token_id, header, tokenizer)
    return config


LLAMA3_CONTEXTS = (8192, 4096, 16384, 32768, 2048, 65536, 131072)
"""The pre-training contexts tried when reading Llama 3's scaling back from its rope divisors (8192: 3.1, 3.2)."""


def llama3_scaling(header: GgufHeader) -> dict[str, Any] | None:
    """Llama 3's rope scaling whose per-frequency divisors are the GGUF's ``rope_freqs`` (llama.cpp stores the
    divisors, not the parameters), or None when no setting reproduces them. The factor is the largest divisor;
    the low/high frequency factors are Llama 3's 1 and 4; the original context is searched. Checked through
    Ster's own rotary code (``scale_frequencies``), to 1e-5."""
    if header.rope_freqs is None:
        return None
    import torch

    from ster.engine.model.config import RopeScaling
    from ster.engine.model.decoder import scale_frequencies

    arch = header.architecture
    dim = 2 * len(header.rope_freqs)
    theta = float(header.value(f"{arch}.rope.freq_base") or 10000.0)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    divisors = torch.tensor(header.rope_freqs, dtype=torch.float64)
    factor = float(divisors.max())
    for context in LLAMA3_CONTEXTS:
        scaling: dict[str, Any] = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": context,
        }
        scaled = scale_frequencies(inv_freq, RopeScaling(**scaling))
        if torch.allclose(inv_freq / scaled, divisors, rtol=1e-5, atol=1e-6):
            return scaling
    return None


def _stop_ids(eos: Any, header: GgufHeader, tokenizer: Any) -> int | list[int] | None:
    """The GGUF's eos id, its end-of-turn id when it names one, and any special token of :data:`END_OF_TURN`."""
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    eot = header.value("tokenizer.ggml.eot_token_id")
    ids += [int(eot)] if eot is not None else []
    special = {
        added.content: index
        for index, added in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()
        if added.special
    }
    ids += [special[token] for token in END_OF_TURN if token in special]
    unique = sorted(set(ids), key=ids.index)
    return unique[0] if len(unique) == 1 else (unique or None)


def _check_all_read(path: Path, header: GgufHeader, model: Any, info: dict[str, Any]) -> None:
    """Refuse a model with a parameter no tensor filled, or a file with a tensor no parameter took: transformers'
    reader leaves the first at its random initialisation and drops the second, silently."""
    if info["mismatched_keys"]:
        name, stored, wanted = sorted(info["mismatched_keys"])[0]
        raise Refusal(
            f"{path} stores {name} with shape {list(stored)}, where its header's shape settings make it {list(wanted)}"
        )
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(set(info["missing_keys"]) - tied)
    if missing:
        raise Refusal(f"{path} has no tensor for {len(missing)} of the model's parameters ({missing[0]} first)")
    used = len(set(model.state_dict()) - tied)
    stored = len(header.tensors - {"rope_freqs.weight"} if header.rope_freqs is not None else header.tensors)
    if stored > used:
        raise Refusal(
            f"{path} holds {stored} tensors and its {model.config.model_type} model takes "
            f"{used}; transformers' GGUF reader would drop the rest"
        )


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
    document = {
        name: value
        for name, value in config.to_dict().items()
        if name not in _NOT_WRITTEN and not (name in generic and generic[name] == value)
    }
    document["architectures"] = [type(config).__name__.replace("Config", "ForCausalLM")]
    document["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", False))
    document["torch_dtype"] = "float32"
    return document


def _tokenizer_config(tokenizer: Any, config: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config["max_position_embeddings"],
    }
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, str):
            document[name] = value
    if tokenizer.chat_template:
        document["chat_template"] = tokenizer.chat_template
    return document
