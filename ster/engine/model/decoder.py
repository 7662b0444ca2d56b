"""Ster's own decoder, written for reading and steering: Llama, and the families that differ from it in details.

Ster owns its decoder loop instead of calling a generic inference API because the
loop needs exact operations those APIs do not offer: stop after the deepest layer a
read needs, compute no vocabulary projection (or only the last position's), and
expose each block as a module whose output a forward hook can read or replace.

The module tree mirrors Hugging Face's parameter names (``model.layers.{i}.self_attn.
q_proj.weight`` and so on), so a checkpoint's state dict loads by name with strict
checking. Whatever dtype the weights are held at, three things run in f32: the
rotary angles and rotation, the attention scores and softmax (queries, keys and
values are promoted before the score matmul, only the output is cast back), and the
logits. The KV cache and the residual stream keep the weights' dtype, so a half-
precision run still halves their memory.

Batch-1 decoding reads every weight once per token, so the loop is written to do little
else: each block's q/k/v projections run as one matmul and its gate/up projections as
another (``prepare`` lays the separate weights out as views of one fused tensor, so the
parameter names and the memory are unchanged), queries and keys rotate together, and a
projection runs on the CPU kernel timed fastest on this machine for its precision and row count
(:mod:`ster.engine.model.linear` on :mod:`ster.engine.model.kernels`), with attached LoRA
factors (:mod:`ster.engine.model.adapters.factors`) added to its output. Weights quantized to int8
(``--precision int8``) are torchao tensors; :mod:`ster.engine.model.quantize` runs them.

Other families (Qwen2, Qwen3, Mistral, Phi-3, Gemma 3) run through the same classes: what differs is
data on the config (:class:`ster.engine.model.config.Family` and the fields it normalises), read once
when a block is built — biases, q/k norms, Gemma's ``1 + w`` norms and extra norms around attention
and MLP, the embedding scale, the activation, sliding-window layers with their own rotary base and
mask (:func:`_window_inputs`), the attention scale, final logit soft-capping, partial rotation.
The jobs see it through :class:`ster.engine.model.contract.Decoder`, which transformers' path satisfies too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ster.engine.model.adapters.factors import NO_FACTORS, FactorHost, LoraFactors
from ster.engine.model.config import DecoderConfig, RopeScaling
from ster.engine.model.contract import ForwardOutput, Layout, Vocab, checked_depth
from ster.engine.model.contract import positions as positions_of
from ster.engine.model.linear import embed, fuse, fused_linear, linear


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm: normalise in f32, cast back, then scale by the weight."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight


class Norm(nn.Module):
    """An RMSNorm's learned scale; with ``offset`` 1 (Gemma) the scale applied is ``1 + weight``."""

    def __init__(self, width: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.offset = offset


def norm(x: Tensor, module: Norm) -> Tensor:
    """``module``'s RMSNorm of ``x``: Llama's (:func:`rms_norm`), or Gemma's, ``x̂ · (1 + w)`` all in f32, cast back."""
    if not module.offset:
        return rms_norm(x, module.weight, module.eps)
    weight = module.weight.float() + module.offset
    return F.rms_norm(x.float(), weight.shape, weight, module.eps).to(x.dtype)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class Rotary:
    """Rotary position embedding, computed in f32 for exactly the positions being rotated.

    Nothing is cached per position, so nothing grows with ``max_position_embeddings``.
    """

    def __init__(self, config: DecoderConfig, device: torch.device, local: bool = False) -> None:
        """The rotation of full-attention layers, or with ``local`` that of sliding layers (their own base,
        no scaling; Gemma 3). Only the first ``config.rotary_size`` dimensions of a head rotate."""
        dim = config.rotary_size
        theta = config.rope_local_theta if local and config.rope_local_theta is not None else config.rope_theta
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        self.inv_freq = scale_frequencies(inv_freq, None if local else config.rope_scaling)  # [rot/2] f32

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for ``positions`` [B, T], shaped [B, 1, T, hd] to broadcast over heads."""
        freqs = positions[:, None, :, None].float() * self.inv_freq  # [B, 1, T, hd/2]
        freqs = torch.cat((freqs, freqs), dim=-1)
        return freqs.cos(), freqs.sin()


def scale_frequencies(inv_freq: Tensor, scaling: RopeScaling | None) -> Tensor:
    """Apply a checkpoint's rope scaling (``linear`` or ``llama3``) to the base frequencies."""
    if scaling is None or scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    old_context = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = old_context / scaling.low_freq_factor
    high_wavelen = old_context / scaling.high_freq_factor
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    interpolated = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, interpolated, scaled)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate f32 ``x`` [B, H, T, hd] by the angles (the half-split form HF checkpoints use); with angles for
    fewer dimensions than hd (a partial rotation), only those leading dimensions turn."""
    if cos.shape[-1] < x.shape[-1]:
        turned, kept = torch.split(x, [cos.shape[-1], x.shape[-1] - cos.shape[-1]], dim=-1)
        return torch.cat((_rotate(turned, cos, sin), kept), dim=-1)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class KVCache:
    """Keys and values of every layer, preallocated for the whole generation, at the weights' dtype."""

    def __init__(
        self, config: DecoderConfig, batch: int, max_len: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (config.num_hidden_layers, batch, config.kv_heads, max_len, config.head_size)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        """Positions already written; a forward writes its T positions from here."""

    def append(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's [B, kv, T, hd] keys and values; return every position so far."""
        end = self.length + keys.shape[2]
        self.keys[layer, :, :, self.length : end] = keys
        self.values[layer, :, :, self.length : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def take_prefix(self, alone: KVCache, count: int) -> None:
        """Copy a single-row cache's positions into every one of this cache's ``count`` rows (a shared prefill)."""
        self.keys[:, :, :, : alone.length] = alone.keys[:, :, :, : alone.length]
        self.values[:, :, :, : alone.length] = alone.values[:, :, :, : alone.length]
        self.length = alone.length

    def keep_rows(self, rows: Tensor) -> None:
        """Drop every row but ``rows`` (rows that stopped), keeping what was written."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)


class RaggedCache(KVCache):
    """The cache of a continuous batch: rows of different lengths that join and leave between steps.

    Rows are left-padded to one common length; :meth:`key_mask` marks each row's real positions, which is
    all the decoder needs to give every row its own positions and attention. Storage is preallocated with
    room for more rows and columns: a joining row is written into the next free row, a leaving row is
    replaced by the last one (one row copied, not the cache), and columns that no remaining row uses any
    more are dropped from the left by moving a view. Storage grows (one copy) only when a row or a column
    does not fit.
    """

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, device: torch.device, rows: int = 4) -> None:
        self.config, self.dtype, self.device = config, dtype, device
        self.rows = 0
        self.start = 0
        """The first stored column of the window the rows use."""
        self._allocate(rows, 64)

    def _allocate(self, rows: int, columns: int) -> None:
        config = self.config
        shape = (config.num_hidden_layers, rows, config.kv_heads, columns, config.head_size)
        # zeros, not empty: a padding key is masked out, but its value still meets a zero weight (0 · NaN is NaN)
        self.store_keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.store_values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.store_mask = torch.zeros(rows, columns, dtype=torch.bool, device=self.device)
        self.start, self.length = 0, 0
        self._views()

    def _views(self) -> None:
        """Point :class:`KVCache`'s ``keys`` and ``values`` at the rows and columns in use."""
        self.keys = self.store_keys[:, : self.rows, :, self.start :]
        self.values = self.store_values[:, : self.rows, :, self.start :]

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, columns) the storage holds."""
        return self.store_keys.shape[1], self.store_keys.shape[3]

    def nbytes(self) -> int:
        return 2 * self.store_keys.nelement() * self.store_keys.element_size()

    def key_mask(self, new: int) -> Tensor:
        """[rows, length + new] real positions, the ``new`` positions this step writes included."""
        mask = self.store_mask[: self.rows, self.start : self.start + self.length]
        return torch.cat((mask, torch.ones(self.rows, new, dtype=torch.bool, device=self.device)), dim=1)

    def reserve(self, new: int) -> None:
        """Room for ``new`` more columns, written as real positions of every row by the next forward."""
        rows, columns = self.capacity
        if self.start + self.length + new > columns:
            self._regrow(rows, max(2 * columns, self.length + new + 64), 0)
        window = self.store_mask[: self.rows, self.start + self.length : self.start + self.length + new]
        window.fill_(True)

    def _regrow(self, rows: int, columns: int, pad: int) -> None:
        """Copy the rows in use into storage of ``rows`` × ``columns``, their columns moved ``pad`` to the right."""
        keys, values = self.keys[:, :, :, : self.length], self.values[:, :, :, : self.length]
        mask = self.store_mask[: self.rows, self.start : self.start + self.length]
        count, length = self.rows, self.length
        self._allocate(rows, columns)
        self.rows, self.length = count, length + pad
        self.store_keys[:, :count, :, pad : pad + length] = keys
        self.store_values[:, :count, :, pad : pad + length] = values
        self.store_mask[:count, pad : pad + length] = mask
        self._views()

    def add(self, source: KVCache, row: int = 0, size: int | None = None) -> None:
        """Append a row: row ``row`` of ``source`` (a prefill), its last ``size`` positions (all by default), aligned
        to end with the batch's columns."""
        written = source.length
        size = written if size is None else size
        rows, columns = self.capacity
        grow_rows = self.rows + 1 > rows
        if size > self.length:  # a longer row: every row moves right, into the room at the left or new storage
            pad = size - self.length
            if self.start >= pad and not grow_rows:
                self.start -= pad
                self.length = size
                self.store_mask[: self.rows, self.start : self.start + pad] = False
            else:
                self._regrow(max(rows, self.rows + 1) * (2 if grow_rows else 1), max(columns, size + 64), pad)
        elif grow_rows:
            self._regrow(2 * rows, columns, 0)
        slot, end = self.rows, self.start + self.length
        self.store_keys[:, slot, :, end - size : end] = source.keys[:, row, :, written - size : written]
        self.store_values[:, slot, :, end - size : end] = source.values[:, row, :, written - size : written]
        self.store_mask[slot, self.start : end] = False
        self.store_mask[slot, end - size : end] = True
        self.rows += 1
        self._views()

    def remove(self, row: int) -> None:
        """Drop ``row``; the last row takes its place (the caller moves its own per-row state alike)."""
        last = self.rows - 1
        if row != last:
            self.store_keys[:, row] = self.store_keys[:, last]
            self.store_values[:, row] = self.store_values[:, last]
            self.store_mask[row] = self.store_mask[last]
        self.rows = last
        if self.rows == 0:
            self.start, self.length = 0, 0
        else:  # columns no remaining row uses any more leave the window
            used = self.store_mask[: self.rows, self.start : self.start + self.length].any(dim=0)
            first = int(used.int().argmax()) if bool(used.any()) else self.length
            self.start += first
            self.length -= first
        self._views()

    def take_prefix(self, alone: KVCache, count: int) -> None:
        raise NotImplementedError("a ragged cache takes rows one at a time (add)")

    def keep_rows(self, rows: Tensor) -> None:
        raise NotImplementedError("a ragged cache drops rows one at a time (remove)")


@dataclass(frozen=True)
class StepInputs:
    """What every block of one forward shares: rotary angles, the attention mask, the cache."""

    cos: Tensor
    sin: Tensor
    mask: Tensor | None
    """Boolean [B, 1, T, S] of allowed keys, or None when plain causal attention is exact."""
    causal: bool
    cache: KVCache | None
    adapters: bool = True
    """Whether attached LoRA factors apply in this forward (False: the frozen base, DPO's reference)."""
    local: StepInputs | None = None
    """What sliding-window layers use instead (their angles and window mask), when that differs."""


ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class Attention(nn.Module):
    """Grouped-query self-attention with f32 scores."""

    def __init__(self, config: DecoderConfig, index: int = 0) -> None:
        super().__init__()
        width, hd, family = config.hidden_size, config.head_size, config.family
        bias = config.attention_bias
        qkv_bias = bias or family.qkv_bias
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.kv_heads, hd
        self.q_proj = nn.Linear(width, self.heads * hd, bias=qkv_bias)
        self.k_proj = nn.Linear(width, self.kv_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(width, self.kv_heads * hd, bias=qkv_bias)
        self.o_proj = nn.Linear(self.heads * hd, width, bias=bias)
        if family.qk_norm:
            self.q_norm = Norm(hd, config.rms_norm_eps, family.norm_offset)
            self.k_norm = Norm(hd, config.rms_norm_eps, family.norm_offset)
        self.qk_norm = family.qk_norm
        self.sliding = config.sliding(index)
        """Whether this layer attends through the sliding window (with the step's ``local`` inputs)."""
        self.scale = config.attention_scale
        self.fused_weight: Tensor | None = None
        """q, k and v's weights as one tensor, which ``prepare`` makes the three weights views of."""
        self.fused_bias: Tensor | None = None
        self.lora: dict[str, LoraFactors] = {}
        """Adapter factors attached to this block's projections, by projection name (see :mod:`lora`)."""

    def attend(self, x: Tensor, step: StepInputs, layer: int) -> Tensor:
        batch, length, _ = x.shape
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        lora = self.lora if step.adapters else NO_FACTORS
        # q, k and v in one matmul: [B, T, (H + 2·kv)·hd] → [B, H + 2·kv, T, hd]
        qkv = fused_linear(x, self, ("q_proj", "k_proj", "v_proj"), lora)
        qkv = qkv.view(batch, length, heads + 2 * kv_heads, hd)
        if self.qk_norm:  # each query and key head normalised before the rotation (Qwen3, Gemma 3)
            q, k, v = torch.split(qkv, [heads, kv_heads, kv_heads], dim=2)
            qkv = torch.cat((norm(q, self.q_norm), norm(k, self.k_norm), v), dim=2)
        qkv = qkv.transpose(1, 2)
        view = step.local if self.sliding and step.local is not None else step
        qk = _rotate(qkv[:, : heads + kv_heads].float(), view.cos, view.sin)  # queries and keys, f32
        q, k, v = qk[:, :heads], qk[:, heads:].to(x.dtype), qkv[:, heads + kv_heads :]
        if step.cache is not None:
            k, v = step.cache.append(layer, k, v)  # [B, kv, S, hd]
        if length == 1:
            out = _one_query(q, k.float(), v.float(), self.scale, view.mask)
        else:
            out = F.scaled_dot_product_attention(
                q, k.float(), v.float(), attn_mask=view.mask, is_causal=view.causal, enable_gqa=True, scale=self.scale
            )  # [B, H, T, hd] f32
        out = out.to(x.dtype).transpose(1, 2).reshape(batch, length, heads * hd)
        return linear(out, self.o_proj, lora.get("o_proj"))


def _one_query(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, mask: Tensor | None = None) -> Tensor:
    """Attention of one new token ([B, H, 1, hd] f32) over every cached key ([B, kv, S, hd] f32): a decode step.

    Three small ops instead of ``scaled_dot_product_attention``, whose CPU kernel spends about half
    a millisecond per call on a single query (measured on SmolLM2: 15 ms of a 45 ms token over 30
    layers). Each group of query heads reads its key-value head without copying it. ``mask`` [B, 1, 1, S]
    (True: may see) leaves out padding keys and keys beyond a sliding window.
    """
    batch, heads, _, hd = q.shape
    kv = k.shape[1]
    grouped = q.view(batch, kv, heads // kv, hd)  # [B, kv, group, hd]
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    scores = torch.matmul(grouped, k.transpose(-1, -2)) * scale  # [B, kv, group, S]
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(batch, 1, 1, -1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, kv, group, hd]
    return out.view(batch, heads, 1, hd)


class MLP(nn.Module):
    """The gated feed-forward: down(act(gate(x)) * up(x)), act silu (SwiGLU) or Gemma's tanh-approximated gelu."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        width, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(width, inner, bias=bias)
        self.up_proj = nn.Linear(width, inner, bias=bias)
        self.down_proj = nn.Linear(inner, width, bias=bias)
        self.act = ACTIVATIONS[config.hidden_act]
        self.fused_weight: Tensor | None = None
        """gate and up's weights as one tensor, which ``prepare`` makes the two weights views of."""
        self.fused_bias: Tensor | None = None
        self.lora: dict[str, LoraFactors] = {}
        """Adapter factors attached to this block's projections, by projection name (see :mod:`lora`)."""

    def feed(self, x: Tensor, step: StepInputs) -> Tensor:
        lora = self.lora if step.adapters else NO_FACTORS
        gate, up = fused_linear(x, self, ("gate_proj", "up_proj"), lora).chunk(2, dim=-1)
        return linear(self.act(gate) * up, self.down_proj, lora.get("down_proj"))


class Block(nn.Module):
    """One decoder layer. Its output is the residual stream after the layer: what reads record
    and what steering adds to, through forward hooks on this module.

    Llama's block normalises the input of the attention (``input_layernorm``) and of the MLP
    (``post_attention_layernorm``). A family with ``sandwich_norms`` (Gemma) also normalises their
    outputs before adding them to the residual stream, under Hugging Face's names: ``input_layernorm``,
    ``post_attention_layernorm`` (the attention's output), ``pre_feedforward_layernorm``,
    ``post_feedforward_layernorm``."""

    def __init__(self, config: DecoderConfig, index: int) -> None:
        super().__init__()
        width, eps, family = config.hidden_size, config.rms_norm_eps, config.family
        offset = family.norm_offset
        self.index = index
        self.sandwich = family.sandwich_norms
        self.input_layernorm = Norm(width, eps, offset)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = Norm(width, eps, offset)
        if self.sandwich:
            self.pre_feedforward_layernorm = Norm(width, eps, offset)
            self.post_feedforward_layernorm = Norm(width, eps, offset)
        self.mlp = MLP(config)
        self.write_edit: Callable[[int, Tensor], Tensor] | None = None
        """Set while an ablation edits this block's writes (see :meth:`SterDecoder.edited_writes`): called on the
        attention's (0) and the MLP's (1) output before it is normalised (sandwich) and added to the stream."""

    def forward(self, h: Tensor, step: StepInputs) -> Tensor:
        edit = self.write_edit
        if self.sandwich:
            attended = self.self_attn.attend(norm(h, self.input_layernorm), step, self.index)
            h = h + norm(attended if edit is None else edit(0, attended), self.post_attention_layernorm)
            fed = self.mlp.feed(norm(h, self.pre_feedforward_layernorm), step)
            return h + norm(fed if edit is None else edit(1, fed), self.post_feedforward_layernorm)
        attended = self.self_attn.attend(norm(h, self.input_layernorm), step, self.index)
        h = h + (attended if edit is None else edit(0, attended))
        fed = self.mlp.feed(norm(h, self.post_attention_layernorm), step)
        return h + (fed if edit is None else edit(1, fed))


class Trunk(nn.Module):
    """Embedding, the blocks and the final norm (``model.*`` in a checkpoint)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = Norm(config.hidden_size, config.rms_norm_eps, config.family.norm_offset)


class SterDecoder(nn.Module):
    """A causal language model of any family the config names (see :mod:`ster.engine.model.config`)."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Trunk(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary: Rotary | None = None  # built by `prepare` on the weights' device
        self.local_rotary: Rotary | None = None
        """Sliding layers' rotation when their base differs (Gemma 3); built by ``prepare``."""

    def prepare(self) -> SterDecoder:
        """Tie the output head when the config says so, fuse each block's q/k/v and gate/up weights,
        build the rotary table, freeze."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for block in self.block_list():
            fuse(block.self_attn, ("q_proj", "k_proj", "v_proj"))
            fuse(block.mlp, ("gate_proj", "up_proj"))
        device = self.model.embed_tokens.weight.device
        self.rotary = Rotary(self.config, device)
        if self.config.rope_local_theta is not None:
            self.local_rotary = Rotary(self.config, device, local=True)
        self.requires_grad_(False)
        return self.eval()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty KV cache for ``batch`` rows of up to ``max_len`` positions, at the weights' dtype and device."""
        weight = self.lm_head.weight
        return KVCache(self.config, batch, max_len, weight.dtype, weight.device)

    def projections(self) -> list[Tensor]:
        """Every weight a forward multiplies by, in the order it does: each block's q/k/v (fused), o, gate/up
        (fused) and down, then the output head. What the CPU kernels are timed on."""
        weights: list[Tensor] = []
        for block in self.block_list():
            modules: tuple[tuple[Attention | MLP, tuple[str, ...], str], ...] = (
                (block.self_attn, ("q_proj", "k_proj", "v_proj"), "o_proj"),
                (block.mlp, ("gate_proj", "up_proj"), "down_proj"),
            )
            for module, names, last in modules:
                fused = module.fused_weight
                weights += [fused] if fused is not None else [getattr(module, n).weight for n in names]
                weights.append(getattr(module, last).weight)
        return [*weights, self.lm_head.weight]

    def lora_module(self, layer: int, projection: str) -> FactorHost:
        """The module of ``layer`` that holds ``projection`` and its attached LoRA factors."""
        block = self.layer(layer)
        return block.self_attn if projection in ATTENTION_PROJECTIONS else block.mlp

    def write_gains(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """The scale ``g`` each write of block ``layer`` (the attention's, the MLP's) is multiplied by after its
        norm before it is added (Gemma's sandwich norms, offset included); None for writes added as they are."""
        block = self.layer(layer)
        if not block.sandwich:
            return None, None
        after = (block.post_attention_layernorm, block.post_feedforward_layernorm)
        return cast(tuple[Tensor, Tensor], tuple(module.weight.detach().float() + module.offset for module in after))

    @contextmanager
    def edited_writes(self, layers: list[int], edit: Callable[[int, int, Tensor], Tensor]) -> Iterator[None]:
        """While the block runs, each write of the listed blocks is ``edit(layer, which, write)`` (``which``: 0 the
        attention's, 1 the MLP's) before it is normalised and added."""
        try:
            for layer in layers:
                self.layer(layer).write_edit = partial(edit, layer)
            yield
        finally:
            for layer in layers:
                self.layer(layer).write_edit = None

    def layer(self, index: int) -> Block:
        """Block ``index``, typed (``blocks`` is the ModuleList hooks and checkpoints see)."""
        return cast(Block, self.blocks[index])

    def block_list(self) -> list[Block]:
        return [cast(Block, block) for block in self.blocks]

    def forward(
        self,
        ids: Tensor,
        *,
        cache: KVCache | None = None,
        key_mask: Tensor | None = None,
        depth: int | None = None,
        vocab: Vocab = "last",
        layout: Layout | None = None,
        adapters: bool = True,
        start: tuple[int, Tensor] | None = None,
    ) -> ForwardOutput:
        """Run ``ids`` [B, T] through the first ``depth`` blocks (all by default).

        ``key_mask`` [B, S] marks real (True) and padding (False) positions over the
        cache and these ids together. Logits need every block, so ``vocab`` must be
        ``none`` when ``depth`` stops early. ``layout`` replaces the positions and the
        causal mask for a packed forward (no cache). ``adapters`` False skips every attached
        LoRA update for this forward: the frozen base, which is DPO's reference, with no second copy.
        ``start`` (block, hidden [B, T, D]) resumes at that block from the stream a forward of the same
        ids stopped before it (``depth=block``), so rows that differ only from that block on share the rest.
        """
        assert self.rotary is not None, "call prepare() after loading weights"
        depth = checked_depth(len(self.blocks), depth, vocab)
        past = cache.length if cache is not None else 0
        mask: Tensor | None
        if layout is not None:
            positions, mask, causal = layout.positions, layout.mask, False
        else:
            positions = positions_of(ids, past, key_mask)
            mask, causal = _attention_mask(ids.shape[1], past, key_mask, positions.device)
        cos, sin = self.rotary.angles(positions)
        step = StepInputs(cos, sin, mask, causal, cache, adapters)
        if self.config.sliding_window is not None:
            step = replace(step, local=self._window_inputs(step, positions, past, key_mask, layout))
        if start is None:
            first = 0
            h = embed(ids, self.model.embed_tokens.weight)  # [B, T, D]
            if self.config.family.embed_scale:  # Gemma: × sqrt(hidden_size), rounded to the weights' dtype
                h = h * torch.tensor(self.config.hidden_size**0.5, dtype=h.dtype)
        else:
            first, h = start
        for block in self.blocks[first:depth]:
            h = block(h, step)
        if cache is not None:
            cache.length += ids.shape[1]
        return ForwardOutput(h, self._logits(h, vocab))

    def _window_inputs(
        self, step: StepInputs, positions: Tensor, past: int, key_mask: Tensor | None, layout: Layout | None
    ) -> StepInputs:
        """The sliding layers' angles and mask: the full layers' mask less every key a window or more before
        the query, counted in positions (real tokens), so padding and packed layouts slide as a lone row does."""
        window = self.config.sliding_window
        assert window is not None
        cos, sin = (step.cos, step.sin) if self.local_rotary is None else self.local_rotary.angles(positions)
        total = past + positions.shape[1]
        if total <= window:  # no query can see a key a window away
            return replace(step, cos=cos, sin=sin)
        mask = step.mask
        if mask is None:
            query_index = torch.arange(past, total, device=positions.device)[:, None]
            mask = (torch.arange(total, device=positions.device)[None, :] <= query_index)[None, None]  # [1, 1, T, S]
        if layout is not None:
            key_positions = positions
        elif key_mask is not None:
            key_positions = (key_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        else:
            key_positions = torch.arange(total, device=positions.device)[None, :]
        near = (positions[:, None, :, None] - key_positions[:, None, None, :]) < window  # [B, 1, T, S]
        return replace(step, cos=cos, sin=sin, mask=mask & near, causal=False)

    def _logits(self, h: Tensor, vocab: Vocab) -> Tensor | None:
        if vocab == "none":
            return None
        return self.project(h[:, -1] if vocab == "last" else h)

    def final_norm(self, h: Tensor) -> Tensor:
        """The final RMSNorm of residual states [..., D]: what the output head (or a reward head) reads."""
        return norm(h, self.model.norm)

    def project(self, h: Tensor) -> Tensor:
        """f32 logits [..., V] of residual states [..., D] taken before the final norm.

        Training calls it on the positions a loss reads only (``vocab="none"`` first), so the
        vocabulary projection, the widest matmul of the model, is computed nowhere else.
        """
        logits = linear(self.final_norm(h), self.lm_head).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def _attention_mask(
    length: int, past: int, key_mask: Tensor | None, device: torch.device
) -> tuple[Tensor | None, bool]:
    """The boolean [B, 1, T, S] mask of keys each query may see, or (None, causal) when the
    plain causal rule is exact: no padding, and either one query or no cached keys."""
    if key_mask is None and (length == 1 or past == 0):
        return None, length > 1
    total = past + length
    query_pos = torch.arange(past, total, device=device)[:, None]
    key_pos = torch.arange(total, device=device)[None, :]
    allowed = (key_pos <= query_pos)[None, None]  # [1, 1, T, S]
    if key_mask is not None:
        # A padding query would see no key at all and produce NaN; let it see itself.
        allowed = (allowed & key_mask[:, None, None, :]) | (key_pos == query_pos)[None, None]
    return allowed, False
