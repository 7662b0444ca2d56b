"""Opening a checkpoint: resolution, config and tokenizer first, then the weights, kept between jobs.

Opening is two steps on purpose. :meth:`ModelStore.open` reads only JSON, the
tokenizer and the fingerprint's few windows of the weights files, so a job can refuse a
bad layer, a broken chat template, a prompt longer than the context or an artifact
fitted on another model before a weight is read; :meth:`ModelStore.decoder` reads the
weights, and keeps the decoder keyed by (model, revision, precision, device) so the
second job on the same model — in the TUI, or a server — does not load it again.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ster.engine.model.chat import (
    DECISION_SENTENCES,
    ChatDecision,
    ChatTemplate,
    decide,
    find_template,
    read_tokenizer_config,
    special_tokens,
)
from ster.engine.model.codec import TextCodec, eos_ids, load_tokenizer
from ster.engine.model.config import DecoderConfig, decoder_name, fused_rows, load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.requests import ChatMode, ModelRequest
from ster.engine.model.resolve import ModelSource, resolve_model
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import read_json
from ster.engine.protocol.naming import flag

if TYPE_CHECKING:
    import torch

    from ster.engine.model.contract import Decoder
    from ster.engine.model.decoder import SterDecoder
    from ster.engine.protocol.jobs import JobContext


@dataclass(frozen=True)
class Checkpoint:
    """A resolved checkpoint with its config and text codec; no weights yet."""

    source: ModelSource
    config: DecoderConfig
    codec: TextCodec
    request: ModelRequest
    fingerprint: str
    """What the checkpoint is, wherever it lies (see :mod:`ster.engine.model.fingerprint`)."""

    @property
    def chat_template(self) -> ChatDecision:
        return self.codec.decision

    @property
    def context(self) -> int:
        """Positions the model has: config.json's ``max_position_embeddings``."""
        return self.config.max_position_embeddings


class ModelStore:
    """Resolves checkpoints and keeps their loaded decoders for reuse."""

    def __init__(self) -> None:
        self._decoders: dict[tuple[str, str | None, str, str], Decoder] = {}
        self._lock = threading.Lock()

    def open(self, request: ModelRequest, ctx: JobContext) -> Checkpoint:
        """Resolve the model and read everything but its weights; report the chat-template decision."""
        ctx.progress("resolve", f"resolving model {request.model}")
        source = resolve_model(request.model, request.revision)
        if source.warning:
            ctx.warn(source.warning)
        config = load_config(source.config)
        codec = _codec(source, config, request.chat_template)
        ctx.log(DECISION_SENTENCES[codec.decision], {"chat_template": codec.decision})
        return Checkpoint(source, config, codec, request, checkpoint_fingerprint(config, source.weights))

    def decoder(self, checkpoint: Checkpoint, ctx: JobContext) -> Decoder:
        """The checkpoint's decoder at the requested precision and device, loading it once."""
        request = checkpoint.request
        device = resolve_device(request.device)
        key = (checkpoint.source.model, checkpoint.source.revision, request.precision, str(device))
        with self._lock:
            if key in self._decoders:
                return self._decoders[key]
            if checkpoint.config.native and device.type == "cpu":
                from ster.engine.model.kernels import mode

                mode()  # a bad STER_KERNELS is refused before a weight is read
            ctx.progress("load", f"loading {checkpoint.source.model} weights at {request.precision} on {device}")
            if not checkpoint.config.native:
                ctx.progress("load", _generic_sentence(checkpoint.config))
            decoder = load_decoder(checkpoint.source, checkpoint.config, request.precision, device)
            if checkpoint.config.native and device.type == "cpu":
                from ster.engine.model.kernels import choose

                chosen = choose(cast("SterDecoder", decoder).projections(), request.precision)  # (native: Ster's own)
                if chosen.how == "measured":
                    ctx.progress("load", chosen.sentence())
            self._decoders[key] = decoder
            return decoder


def _generic_sentence(config: DecoderConfig) -> str:
    """What the progress stream says, once, of a model that runs through transformers' own model."""
    why = (
        f"it uses {config.unimplemented}"
        if config.unimplemented is not None
        else f'model_type "{config.model_type}" has no decoder of Ster\'s own'
    )
    return (
        f"{why}, so it runs through transformers' model, read and steered by hooks on its layers: correct, but "
        "slower than the native decoder"
    )


def model_store(ctx: JobContext) -> ModelStore:
    """The model store of the job's front end, created on the context when the front end gave none."""
    if ctx.models is None:
        ctx.models = ModelStore()
    return ctx.models


def _codec(source: ModelSource, config: DecoderConfig, mode: ChatMode) -> TextCodec:
    tokenizer = load_tokenizer(source.tokenizer)
    tokenizer_config = read_tokenizer_config(source.tokenizer_config)
    template_text = find_template(tokenizer_config, source.chat_template_file)
    decision = decide(mode, template_text)
    template = None
    if decision == "applied" and template_text is not None:
        template = ChatTemplate.compile(template_text, special_tokens(tokenizer_config))
        template.render_prompt("probe")  # a template that cannot render a user turn fails here, before weights
    generation_eos: list[int] = []
    if source.generation_config is not None:
        value = read_json(source.generation_config, "generation config").get("eos_token_id")
        generation_eos = [value] if isinstance(value, int) else list(value or [])
    return TextCodec(
        tokenizer, decision, template, eos_ids(tokenizer, tokenizer_config, config.eos_ids, generation_eos)
    )


DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "int8": "float32"}
"""The torch dtype each precision holds its unquantized tensors and activations at (int8: f32)."""


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda``, ``mps`` (or ``metal``), or ``auto`` (the first accelerator present, else cpu)."""
    import torch

    name = "mps" if name == "metal" else name
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if name == "cuda" and not cuda:
        raise Refusal(f"{flag('device')} cuda was asked for, but this torch build sees no CUDA device")
    if name == "mps" and not mps:
        raise Refusal(f"{flag('device')} mps (metal) was asked for, but this torch build sees no Metal device")
    return torch.device(name)


def load_decoder(source: ModelSource, config: DecoderConfig, precision: str, device: torch.device) -> Decoder:
    """Build the decoder with no initialisation cost and map the checkpoint's weights into it."""
    import torch
    from safetensors import SafetensorError, safe_open

    from ster.engine.model.decoder import SterDecoder

    dtype = getattr(torch, DTYPES[precision])
    if not config.native:
        if precision == "int8":
            raise Refusal(
                f'{flag("precision")} int8 runs on Ster\'s own decoders only, and model_type "{config.model_type}" '
                "runs through transformers"
            )
        from ster.engine.model.generic import load_generic

        return load_generic(source.root, config, dtype, device)
    quantize = _quantizer(precision)
    with torch.device("meta"):
        decoder = SterDecoder(config)
    state: dict[str, torch.Tensor] = {}
    for path in source.weights:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as weights:  # checks the header
                names = [
                    name
                    for name in weights.keys()
                    if not name.endswith("rotary_emb.inv_freq") and decoder_name(config, name) is not None
                ]
                # (some old checkpoints store the rotary table; it is recomputed. A multimodal checkpoint's
                # other towers are not read.)
            renamed = ((decoder_name(config, name) or name, tensor) for name, tensor in read_tensors(path, names))
            for name, tensor in split_fused(renamed, config):
                if quantize is not None and tensor.ndim == 2:  # projections, head, embedding
                    state[name] = quantize(tensor.to(device=device))
                else:
                    state[name] = tensor.to(device=device, dtype=dtype)
        except (OSError, SafetensorError, ValueError) as exc:
            raise Refusal(f"weights file {path} could not be read: {exc}") from None
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state.get("model.embed_tokens.weight", torch.empty(0))
    _check_state(decoder, state, source)
    decoder.load_state_dict(state, strict=True, assign=True)
    state.clear()  # the decoder holds the only references now, so prepare() frees each block's separate
    # q/k/v and gate/up tensors as it fuses them: the peak stays one block above the model
    return decoder.prepare()


def split_fused(
    tensors: Iterator[tuple[str, torch.Tensor]], config: DecoderConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the decoder's names: a family's fused projection (Phi-3's ``qkv_proj``,
    ``gate_up_proj``) becomes the projections it stacks, as views of its rows; every other tensor as it is."""
    fused = config.family.fused
    for name, tensor in tensors:
        pieces = name.rsplit(".", 2)  # [module, projection, weight or bias]
        if len(pieces) < 3 or pieces[1] not in fused:
            yield name, tensor
            continue
        module, projection, kind = pieces
        parts = fused[projection]
        rows = [fused_rows(config, part) for part in parts]
        if tensor.shape[0] != sum(rows):
            yield name, tensor  # left whole, so the shape check names it
            continue
        for part, piece in zip(parts, tensor.split(rows, dim=0)):
            yield f"{module}.{part}.{kind}", piece


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_tensors(path: Path, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors ``names`` of safetensors file ``path``, each read into memory of its own.

    Not through safetensors' memory map. A mapped file stays mapped while any tensor of it is
    alive, and every page of it a read has touched stays counted in the process's resident
    memory: ``prepare`` reads the q/k/v and gate/up weights to copy them into their fused
    tensors, and their mapped pages stayed resident beside the copies for the whole run
    (measured on SmolLM2 at f32: an SFT run peaked at 1,348 MiB against 1,079 MiB without
    fusing). Read with ``readinto``, a file's pages stay in the page cache, which is not the
    process's, and each weight is held once. The caller has checked the header with
    ``safe_open``; a tensor that would end past the end of the file is refused.
    """
    import torch

    with open(path, "rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
        for name in names:
            entry = header[name]
            start, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=getattr(torch, _SAFETENSORS_DTYPES[entry["dtype"]]))
            if tensor.numel():
                file.seek(8 + size + start)
                if file.readinto(tensor.reshape(-1).view(torch.uint8).numpy().data) != end - start:
                    raise ValueError(f"tensor {name} ends past the end of the file")
            yield name, tensor


def _quantizer(precision: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What each 2-D weight goes through as it is read: torchao's int8 for ``int8``, nothing otherwise.

    Quantizing tensor by tensor keeps the peak at one f32 tensor beyond the int8 model."""
    if precision != "int8":
        return None
    from ster.engine.model.quantize import int8_tensor_type, quantize

    try:
        int8_tensor_type()
    except ImportError:
        raise Refusal(f"{flag('precision')} int8 needs the torchao package: pip install torchao==0.18.0") from None
    return quantize


def _check_state(decoder: Decoder, state: dict[str, Any], source: ModelSource) -> None:
    """Refuse weights that do not match config.json, naming the first tensor that disagrees."""
    expected = {name: tuple(p.shape) for name, p in decoder.state_dict().items()}
    where = source.weights[0].parent
    for name, shape in expected.items():
        if name not in state or state[name].numel() == 0:
            raise Refusal(f"the weights in {where} have no tensor {name}, which config.json implies")
        if tuple(state[name].shape) != shape:
            raise Refusal(
                f"tensor {name} in {where} has shape {tuple(state[name].shape)}, but config.json implies {shape}"
            )
    extra = sorted(set(state) - set(expected))
    if extra:
        raise Refusal(
            f"the weights in {where} hold tensor {extra[0]}, which a {decoder.config.model_type} decoder does not have"
        )
