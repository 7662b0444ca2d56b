"""The LoRA adapter artifact: ``<name>.safetensors`` with its factors, ``<name>.json`` beside it.

The safetensors file holds ``layers.{layer}.{target}.a`` (A, ``[rank, in]``) and
``layers.{layer}.{target}.b`` (B, ``[out, rank]``) for every adapted projection, plus
``reward.head`` (``[1, hidden_size]``) for a reward model. The sidecar says what they
are: schema_version, product, kind, the model (name, revision, fingerprint), rank,
alpha, targets (short names), layers, hidden_size, and the run's report under
``train``. The two travel together: a file without its sidecar is refused, and the sidecar
records the SHA-256 of the file's bytes (``tensors_sha256``), so a pair put together from two
writes (a kill between the two renames, files copied apart) is refused too.

This module reads the sidecar, refusing a field no adapter has (a rank below 1, an alpha that
is not a positive finite number, a layer below 0 or beyond any model's, an unknown or repeated
target, a width outside what Ster reads), and checks a safetensors header against it.
Reading the file wholly (its bytes against its header, the hash, every value) is
:mod:`ster.engine.model.adapters.file`; building factors is :mod:`ster.engine.model.adapters.lora`.
None of it imports torch, so ``ster tune inspect`` and every refusal come before torch is imported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ster.engine.model.config import MAX_LAYERS, MAX_SIZE
from ster.engine.model.provenance import check_identity, provenance_warnings
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import first_error

if TYPE_CHECKING:
    from ster.engine.model.config import DecoderConfig

SCHEMA_VERSION = 1
TARGETS: dict[str, str] = {
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
    "output": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}
"""Short name → the projection's name in the decoder (and in Hugging Face checkpoints)."""
ATTENTION = ("query", "key", "value", "output")
ALIASES: dict[str, str] = {
    **{name: name for name in TARGETS},
    **{hf: name for name, hf in TARGETS.items()},
    "q": "query",
    "k": "key",
    "v": "value",
    "o": "output",
}
"""Every accepted spelling of a target, lower case → its short name."""
REWARD_HEAD = "reward.head"
READS_HIDDEN = ("query", "key", "value", "gate", "up")
"""Targets whose A reads the residual stream (``hidden_size`` columns)."""
WRITES_HIDDEN = ("output", "down")
"""Targets whose B writes the residual stream (``hidden_size`` rows)."""


def parse_targets(text: str | list[str]) -> list[str]:
    """Short names of a comma list of targets, in the flag's order, repeats collapsed."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names: list[str] = []
    for item in items:
        key = item.strip().lower()
        if not key:
            continue
        if key not in ALIASES:
            raise Refusal(f'unknown adapter target "{item.strip()}"; expected one of {", ".join(TARGETS)}')
        if ALIASES[key] not in names:
            names.append(ALIASES[key])
    if not names:
        raise Refusal("no targets selected")
    return names


def check_spec(rank: int, alpha: float) -> None:
    """Refuse a rank or alpha that trains or scales nothing."""
    if rank < 1:
        raise Refusal(f"adapter rank {rank} trains nothing; choose a rank of at least 1")
    if not (math.isfinite(alpha) and alpha > 0):
        raise Refusal(f"adapter alpha {alpha} is not a positive finite number")


def projection_shape(config: DecoderConfig, target: str) -> tuple[int, int]:
    """(out, in) of the projection a target names."""
    hidden, inner = config.hidden_size, config.intermediate_size
    attention, kv = config.num_attention_heads * config.head_size, config.kv_heads * config.head_size
    return {
        "query": (attention, hidden),
        "key": (kv, hidden),
        "value": (kv, hidden),
        "output": (hidden, attention),
        "gate": (inner, hidden),
        "up": (inner, hidden),
        "down": (hidden, inner),
    }[target]


def factor_names(layer: int, target: str) -> tuple[str, str]:
    return f"layers.{layer}.{target}.a", f"layers.{layer}.{target}.b"


class AdapterSidecar(BaseModel):
    """``<name>.json``: what the factors beside it are and which run made them."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    product: str = "ster"
    kind: Literal["adapter", "reward"] = "adapter"
    """``reward``: the file also holds ``reward.head``, and the artifact scores rather than generates."""
    model: str
    model_revision: str | None = None
    model_fingerprint: str | None = None
    """What the checkpoint was (see :mod:`ster.engine.model.fingerprint`); null in files made elsewhere."""
    rank: int
    alpha: float
    targets: list[str]
    layers: list[int]
    hidden_size: int
    tensors_sha256: str | None = None
    """SHA-256 (hex) of the safetensors file's bytes, which binds the pair; null in adapters written
    before Ster recorded it (read without the check) and in one read from a PEFT directory."""
    train: dict[str, Any] | None = None
    """The report of the run that wrote the adapter (null for an adapter imported from PEFT)."""

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def expected_shapes(self, config: DecoderConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor the safetensors file must hold, with its shape."""
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            for target in self.targets:
                out, inner = projection_shape(config, target)
                a, b = factor_names(layer, target)
                shapes[a], shapes[b] = (self.rank, inner), (out, self.rank)
        if self.kind == "reward":
            shapes[REWARD_HEAD] = (1, self.hidden_size)
        return shapes


def sidecar_path(path: Path) -> Path:
    """The sidecar of an adapter file: its path with the extension replaced by ``.json``."""
    return path.with_suffix(".json")


def read_sidecar(path: Path) -> AdapterSidecar:
    """The sidecar of the adapter at ``path``, refused in one sentence when missing or malformed."""
    side = sidecar_path(path)
    if not confine.readable(path).exists():
        raise Refusal(f"failed to read adapter {path}: it does not exist")
    if not confine.readable(side).exists():
        raise Refusal(f"adapter {path} has no sidecar at {side}; the pair is written together and must travel together")
    try:
        raw = json.loads(confine.readable(side).read_text(encoding="utf-8-sig"))
    except OSError:
        raise Refusal(f"failed to read adapter sidecar {side}") from None
    except ValueError:
        raise Refusal(f"invalid adapter sidecar JSON in {side}") from None
    return parse_sidecar(raw, side)


def parse_sidecar(raw: Any, side: Path) -> AdapterSidecar:
    if isinstance(raw, dict) and "trait_name" in raw and "vectors" in raw:
        raise Refusal(
            f"{side} is a steering artifact, not a LoRA adapter sidecar: it carries trait_name and "
            "vectors where an adapter sidecar carries rank and targets"
        )
    if isinstance(raw, dict) and raw.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise Refusal(
            f"adapter artifact schema {raw['schema_version']} is unsupported; this Ster build reads "
            f"schema {SCHEMA_VERSION}"
        )
    if isinstance(raw, dict) and raw.get("product", "ster") != "ster":
        raise Refusal(f'adapter artifact belongs to product "{raw["product"]}", not Ster')
    try:
        sidecar = AdapterSidecar.model_validate(raw, strict=True)  # a rank of "8" or true is not a rank
    except ValidationError as exc:
        raise Refusal(f"invalid adapter sidecar JSON in {side}: {first_error(exc)}") from None
    if sidecar.rank == 0:
        raise Refusal(f"adapter sidecar {side} declares rank 0, which stores nothing")
    check_spec(sidecar.rank, sidecar.alpha)
    parse_targets(sidecar.targets)
    if any(ALIASES[t.lower()] != t for t in sidecar.targets):
        raise Refusal(f"adapter sidecar {side} names targets by other spellings; Ster writes short names")
    check_fields(sidecar, side)
    return sidecar


def check_fields(sidecar: AdapterSidecar, side: Path) -> None:
    """Refuse a sidecar field no adapter of any model has, naming it."""
    where = f"adapter sidecar {side}"
    for name, value in (("rank", sidecar.rank), ("hidden_size", sidecar.hidden_size)):
        if not 1 <= value <= MAX_SIZE:
            raise Refusal(f"{where} gives {name} {value}, outside 1 to {MAX_SIZE}, the sizes Ster reads")
    if len(set(sidecar.targets)) != len(sidecar.targets):
        repeated = next(t for t in sidecar.targets if sidecar.targets.count(t) > 1)
        raise Refusal(f"{where} names target {repeated} twice")
    if not sidecar.layers:
        raise Refusal(f"{where} lists no layers, so the adapter changes nothing")
    for layer in sidecar.layers:
        if not 0 <= layer < MAX_LAYERS:
            raise Refusal(
                f"{where} lists layer {layer}, which no model has (layers are numbered from 0, and Ster "
                f"reads models of at most {MAX_LAYERS} layers)"
            )
        if sidecar.layers.count(layer) > 1:
            raise Refusal(f"{where} lists layer {layer} twice")
    digest = sidecar.tensors_sha256
    if digest is not None and (len(digest) != 64 or digest.strip("0123456789abcdef")):
        raise Refusal(f"{where} gives tensors_sha256 {digest!r}, which is not a SHA-256 in hex")


def check_tensors(
    sidecar: AdapterSidecar, header: dict[str, dict[str, Any]], expected: dict[str, tuple[int, ...]], path: Path
) -> None:
    """Refuse a missing, misshapen or unexpected tensor, naming it."""
    if sidecar.kind == "adapter" and REWARD_HEAD in header:
        raise Refusal("adapter artifact carries a reward.head tensor but declares kind adapter")
    for name, shape in expected.items():
        if name not in header:
            if name == REWARD_HEAD:
                raise Refusal("reward artifact is missing tensor reward.head, which is the head it exists to carry")
            raise Refusal(f"adapter artifact {path} is missing tensor {name}")
        got = tuple(header[name].get("shape", ()))
        if len(got) != 2:
            raise Refusal(f"adapter tensor {name} has shape {list(got)}, expected {list(shape)}")
        for axis, word in ((0, "rows"), (1, "columns")):
            if got[axis] != shape[axis]:
                raise Refusal(f"adapter tensor {name} has {got[axis]} {word}, expected {shape[axis]}")
    extra = sorted(set(header) - set(expected))
    if extra:
        raise Refusal(f"adapter artifact {path} holds tensor {extra[0]}, which its sidecar does not declare")


def check_for_model(
    sidecar: AdapterSidecar,
    model: str,
    fingerprint: str,
    hidden_size: int,
    layers: int,
    want: Literal["adapter", "reward"] = "adapter",
) -> str | None:
    """Refuse applying an adapter to a model it was not trained for, or of the wrong kind; the log line
    when only the fingerprint, not the name, says the model is the same."""
    if want == "adapter" and sidecar.kind == "reward":
        raise Refusal("adapter artifact is a reward model, not a generation adapter")
    if want == "reward" and sidecar.kind != "reward":
        raise Refusal("adapter artifact is a generation adapter, not a reward model")
    note = check_identity(
        "adapter",
        sidecar.model,
        sidecar.model_fingerprint,
        model,
        fingerprint,
        "the adapter was trained",
        both_prints=False,
    )
    if sidecar.hidden_size != hidden_size:
        raise Refusal(f"adapter width {sidecar.hidden_size} does not match model width {hidden_size}")
    beyond = [layer for layer in sidecar.layers if not 0 <= layer < layers]
    if beyond:
        raise Refusal(f"adapter spec names layer {beyond[0]}, but the model has {layers} layers")
    return note


def adapter_provenance(sidecar: AdapterSidecar, precision: str, chat_template: str | None) -> list[str]:
    """The warnings for an adapter read at other settings than it was trained at; none for null records."""
    train = sidecar.train or {}
    return provenance_warnings(
        "adapter",
        train.get("precision"),
        train.get("chat_template"),
        precision,
        chat_template,
        "so the number below describes a format it was not trained in",
    )
