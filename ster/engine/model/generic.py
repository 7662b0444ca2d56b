"""Any other causal language model, run through transformers' own model class.

Ster's own decoder (:mod:`ster.engine.model.decoder`) runs the families it knows. A causal LM
of another family that transformers can load runs here instead, behind the same interface
the jobs call (``forward`` with a cache, a key mask, a depth, a vocabulary choice and a packed
layout; ``blocks``; ``final_norm``; ``project``; ``lm_head``; ``new_cache``), so reading,
steering, training and decoding need no second code path:

- **Blocks** are the model's own decoder layers (the one ``ModuleList`` as long as the config's
  layer count). A block's output is the residual stream after it, read and steered by the same
  forward hooks as on Ster's decoder. A forward that needs no logits stops after the deepest
  block it reads (a hook raises once the state is recorded), as Ster's decoder does.
- **Adapters** are LoRA factors on the layers' ``self_attn.{q,k,v,o}_proj`` and
  ``mlp.{gate,up,down}_proj`` — PEFT's own layout of the update ``scale · B (A x)`` — added by a
  forward hook on each projection, so the adapter files, training, merging and PEFT export are the
  same as on Ster's decoder. A target the model's layers do not have is refused by name.
- **Caches** are transformers' ``DynamicCache``; packed layouts pass a 4-D additive mask (one per
  layer type when some layers slide).

It is slower than Ster's own decoder (no fused projections, transformers' per-call overhead)
and the job says so once, on the progress stream, when the weights load.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from ster.engine.model.adapters.factors import FactorHost, add_piece_updates
from ster.engine.model.config import FULL, SLIDING, DecoderConfig, fused_rows
from ster.engine.model.contract import ForwardOutput, Layout, Vocab, checked_depth
from ster.engine.model.contract import positions as positions_of
from ster.engine.model.hooks import Hook, hooked, stream
from ster.engine.protocol.errors import Refusal, first_sentence

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LORA_MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
WRITE_MODULES = (("self_attn", "o_proj"), ("mlp", "down_proj"))
"""Where a layer's two writes into the residual stream come from: the attention's output and the MLP's."""
"""Where a LoRA target lives in a transformers decoder layer (PEFT's names for Llama-like layers)."""
FINAL_NORMS = ("norm", "final_layernorm", "ln_f", "final_layer_norm", "norm_f")


class _Stop(Exception):
    """Raised by the capturing hook once the deepest block a read needs has run."""


class GenericCache:
    """transformers' DynamicCache, with the position count Ster's decoding loop reads."""

    def __init__(self, model: PreTrainedModel) -> None:
        from transformers import DynamicCache

        self.inner = DynamicCache(config=model.config)
        self.length = 0

    def take_prefix(self, alone: GenericCache, count: int) -> None:
        """Become ``alone``'s single-row cache repeated for ``count`` rows (a group's shared prefill)."""
        alone.inner.batch_repeat_interleave(count)
        self.inner, self.length = alone.inner, alone.length

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only the cache rows ``rows`` (rows that stopped are dropped)."""
        self.inner.batch_select_indices(rows)


class GenericDecoder(nn.Module):
    """A transformers causal LM behind the interface of Ster's :class:`~ster.engine.model.decoder.SterDecoder`."""

    def __init__(self, config: DecoderConfig, model: PreTrainedModel, hosts_adapters: bool = True) -> None:
        """``hosts_adapters`` false leaves ``model`` exactly as it is (no hook, no attribute on its projections):
        a view of a model the caller holds, read and steered by hooks that come and go with each block of code
        (:mod:`ster.engine.steering.held`), and never given an adapter."""
        super().__init__()
        self.config = config
        self.hf = model
        self.layers = _decoder_layers(model, config)
        self.final = _final_norm(model)
        self.adapters_on = True
        """Whether attached LoRA factors apply in the current forward (False: the frozen base)."""
        parameters = inspect.signature(model.forward).parameters
        self._cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters
        if hosts_adapters:
            self._host_adapters()

    def _host_adapters(self) -> None:
        """Make each projection a LoRA target: an empty factor table on its module and a hook adding what
        :func:`ster.engine.model.adapters.lora.attached` puts there."""
        config = self.config
        for layer in self.layers:
            for attribute, names in LORA_MODULES.items():
                module = getattr(layer, attribute, None)
                if module is None:
                    continue
                host = cast(FactorHost, module)
                host.lora = {}  # what lora.attached fills, as on Ster's own blocks
                host.fused_weight = None
                for name in names:
                    child = getattr(module, name, None)
                    if isinstance(child, nn.Linear):
                        child.register_forward_hook(self._lora_hook(host, (name,), [child.out_features]))
                for fused, parts in config.family.fused.items():  # Phi-3's qkv_proj: each piece's rows
                    child = getattr(module, fused, None)
                    if isinstance(child, nn.Linear):
                        widths = [fused_rows(config, part) for part in parts]
                        child.register_forward_hook(self._lora_hook(host, parts, widths))

    def _lora_hook(self, module: FactorHost, names: tuple[str, ...], widths: list[int]) -> Hook:
        """A hook adding the attached factors of the projections ``names`` (one, or the pieces a fused
        projection stacks, ``widths`` rows each) to their share of the output."""

        def hook(linear: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
            if not self.adapters_on or not any(name in module.lora for name in names):
                return None
            return add_piece_updates(args[0], output, names, widths, module.lora)

        return hook

    def prepare(self) -> GenericDecoder:
        self.requires_grad_(False)
        return self.eval()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.layers

    @property
    def lm_head(self) -> nn.Linear:
        return cast(nn.Linear, self.hf.get_output_embeddings())

    def new_cache(self, batch: int, max_len: int) -> GenericCache:
        return GenericCache(self.hf)

    def lora_module(self, layer: int, projection: str) -> FactorHost:
        """The module of ``layer`` that holds ``projection`` and its attached factors, refusing a target this
        model's layers do not have."""
        attribute = next(name for name, names in LORA_MODULES.items() if projection in names)
        module = getattr(self.layers[layer], attribute, None)
        fused = [name for name, parts in self.config.family.fused.items() if projection in parts]
        if module is None or not any(
            isinstance(getattr(module, name, None), nn.Linear) for name in [projection, *fused]
        ):
            raise Refusal(
                f"this {self.config.model_type} model's layers have no {attribute}.{projection} linear "
                "projection, so an adapter cannot target it here"
            )
        return cast(FactorHost, module)

    def _writers(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """A layer's two writes into the stream, as transformers' layers name them; refused for a model whose
        layers have other names (GPT-2's ``c_proj``)."""
        block = self.layers[layer]
        found = [getattr(getattr(block, part, None), name, None) for part, name in WRITE_MODULES]
        if not all(isinstance(module, nn.Module) for module in found):
            raise Refusal(
                f"ablation edits what each block writes into the residual stream, and this {self.config.model_type} "
                "model's layers have no self_attn.o_proj and mlp.down_proj to edit"
            )
        return cast(tuple[nn.Module, nn.Module], tuple(found))

    def write_gains(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """As :meth:`ster.engine.model.decoder.SterDecoder.write_gains`: a layer with norms on its writes (Gemma 2's
        and 3's ``post_attention_layernorm`` and ``post_feedforward_layernorm``, which scale by ``1 + w``)."""
        block = self.layers[layer]
        after = getattr(block, "post_feedforward_layernorm", None)
        if after is None:
            return None, None
        norms: tuple[Any, Any] = (block.post_attention_layernorm, after)
        return norms[0].weight.detach().float() + 1.0, norms[1].weight.detach().float() + 1.0

    @contextmanager
    def edited_writes(self, layers: list[int], edit: Callable[[int, int, Tensor], Tensor]) -> Iterator[None]:
        """As :meth:`ster.engine.model.decoder.SterDecoder.edited_writes`, by forward hooks on the writing
        projections (after any adapter's hook, so the adapted write is what is edited)."""

        def hook_for(layer: int, which: int) -> Hook:
            def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
                return edit(layer, which, output)

            return hook

        modules = [(self._writers(layer), layer) for layer in layers]
        with hooked(
            [module for pair, _ in modules for module in pair],
            [hook_for(layer, which) for _, layer in modules for which in (0, 1)],
        ):
            yield

    def forward(
        self,
        ids: Tensor,
        *,
        cache: GenericCache | None = None,
        key_mask: Tensor | None = None,
        depth: int | None = None,
        vocab: Vocab = "last",
        layout: Layout | None = None,
        adapters: bool = True,
        start: tuple[int, Tensor] | None = None,
    ) -> ForwardOutput:
        """As :meth:`ster.engine.model.decoder.SterDecoder.forward`; ``start`` is only a saving there, so transformers'
        model, which cannot begin at a block, runs every block again and gives the same stream."""
        depth = checked_depth(len(self.blocks), depth, vocab)
        past = cache.length if cache is not None else 0
        mask: Tensor | dict[str, Tensor] | None
        if layout is not None:
            positions, mask = layout.positions, self._layout_mask(layout)
        else:
            positions = positions_of(ids, past, key_mask)
            mask = None if key_mask is None else key_mask.long()
        stop = vocab == "none" and cache is None  # no logits wanted: nothing after the block is run
        seen: dict[str, Tensor] = {}

        def capture(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen["hidden"] = stream(output)
            if stop:
                raise _Stop

        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "use_cache": cache is not None,
            self._cache_keyword: None if cache is None else cache.inner,
        }
        if self._keeps_logits and not stop:
            kwargs["logits_to_keep"] = 1 if vocab == "last" else 0
        self.adapters_on = adapters
        logits = None
        try:
            with hooked([self.blocks[depth - 1]], [capture]), _quiet():
                if stop:
                    try:
                        self.hf(**kwargs)
                    except _Stop:
                        pass
                else:
                    output = self.hf(**kwargs)
                    if vocab != "none":
                        logits = output.logits.float()
                        logits = logits[:, -1] if vocab == "last" else logits
        finally:
            self.adapters_on = True
        if cache is not None:
            cache.length += ids.shape[1]
        return ForwardOutput(seen["hidden"], logits)

    def _layout_mask(self, layout: Layout) -> Tensor | dict[str, Tensor]:
        """The packed layout's mask as transformers takes a prepared one: additive, 0 where a key is seen; with
        a sliding window shorter than the packed row, the windowed mask for the sliding layers too."""
        dtype = self.lm_head.weight.dtype
        floor = torch.finfo(dtype).min

        def additive(allowed: Tensor) -> Tensor:
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, floor)

        window = self.config.sliding_window
        full = additive(layout.mask)
        if window is None or layout.positions.shape[1] <= window:
            return full
        positions = layout.positions
        near = (positions[:, None, :, None] - positions[:, None, None, :]) < window
        sliding = additive(layout.mask & near)
        types = set(self.config.layer_types or [])
        if types == {FULL, SLIDING}:
            return {FULL: full, SLIDING: sliding}
        return sliding

    def final_norm(self, h: Tensor) -> Tensor:
        if self.final is None:
            raise Refusal(
                f"Ster cannot find the final norm of this {self.config.model_type} model, so it cannot "
                "score tokens outside transformers' own forward"
            )
        return cast(Tensor, self.final(h))

    def project(self, h: Tensor) -> Tensor:
        """f32 logits [..., V] of residual states taken before the final norm."""
        logits = self.lm_head(self.final_norm(h)).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def check_projection(self) -> None:
        """Refuse a model whose logits are not ``lm_head(final_norm(h))`` (a logit scale, say): the losses that
        project chosen states alone would be wrong on it. One short forward, compared with transformers' logits."""
        ids = torch.tensor([[0, 1, 2]], device=self.lm_head.weight.device)
        with torch.inference_mode():
            out = self(ids, vocab="all")
            ours = self.project(out.hidden)
        if out.logits is None or not torch.allclose(ours, out.logits, atol=1e-3, rtol=1e-3):
            self.final = None


def _decoder_layers(model: PreTrainedModel, config: DecoderConfig) -> nn.ModuleList:
    """The model's decoder layers: the ModuleList holding ``num_hidden_layers`` modules (the first, outermost)."""
    for _, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == config.num_hidden_layers:
            return module
    raise Refusal(
        f"Ster cannot find the {config.num_hidden_layers} decoder layers of this {config.model_type} model "
        "to read and steer"
    )


def _final_norm(model: PreTrainedModel) -> nn.Module | None:
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "base_model", model)
    for name in FINAL_NORMS:
        module = getattr(base, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


@contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_generic(root: Path, config: DecoderConfig, dtype: torch.dtype, device: torch.device) -> GenericDecoder:
    """transformers' own model of the checkpoint in ``root``, at ``dtype`` on ``device``, behind Ster's interface."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        with _quiet():
            loaded = AutoModelForCausalLM.from_pretrained(str(root), dtype=dtype, output_loading_info=True)
            # (with output_loading_info, transformers returns the model and what it could not match)
            model, info = cast(tuple["PreTrainedModel", dict[str, Any]], loaded)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        raise Refusal(f"transformers could not load {root}: {first_sentence(exc)}") from None
    # transformers fills a weight the files lack with random numbers and only logs it; a model that is not what
    # its config.json says is refused instead, naming the first tensor that disagrees.
    for kind, what in (
        ("missing_keys", "have no tensor {}, which config.json implies"),
        ("mismatched_keys", "hold tensor {} at a shape config.json does not imply"),
        ("unexpected_keys", "hold tensor {}, which a {} model does not have"),
    ):
        names = sorted(str(entry[0] if isinstance(entry, tuple) else entry) for entry in info.get(kind) or ())
        if names:
            raise Refusal(f"the weights in {root} " + what.format(names[0], config.model_type))
    nn.Module.to(model, device)  # (transformers wraps PreTrainedModel.to in a decorator its types cannot follow)
    decoder = GenericDecoder(config, model).prepare()
    decoder.check_projection()
    return decoder
