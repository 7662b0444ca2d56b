"""LoRA adapter directories in PEFT's format, read and written: the interchange with the Hugging Face ecosystem.

A PEFT directory holds ``adapter_config.json`` (a :class:`peft.LoraConfig`) and
``adapter_model.safetensors``, whose tensors are named after the module they adapt in a
``transformers`` causal LM (``base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight``:
A ``[r, in]``, ``lora_B.weight``: B ``[out, r]``). These are the same factors a Ster adapter
holds as ``layers.{l}.query.a|b``; only the names and the config differ, so both directions
are a renaming, with peft's own config class doing the parsing and the writing of the JSON.

A fused projection of the checkpoint (Phi-3's ``qkv_proj`` and ``gate_up_proj``, which Ster's
loader splits into its separate projections) is where PEFT puts the factors of the projections
it stacks. One LoRA on it, A ``[r, in]`` and B ``[q + k + v rows, r]``, is exactly separate LoRAs
on q, k and v that share A, B split by rows; read, it becomes those. Written, separate factors
``A_t``, ``B_t`` (rank r each) become one LoRA of rank ``k·r`` over the k targeted pieces: A
stacks the ``A_t``, B is block-diagonal (``B_t`` in its piece's rows and its own r columns, zero
rows for a piece not targeted), and ``alpha_pattern`` gives it ``k·alpha``, so PEFT's scale
``alpha / rank`` is the adapter's. Exact both ways; PEFT's ``rank_pattern`` carries the larger rank.

What a Ster adapter cannot express is refused in one sentence each: other PEFT methods, DoRA
and the other LoRA variants that change the update, modules scaled differently (a rank or
alpha pattern that changes ``alpha / rank``), extra trainable modules, biases, modules other
than the seven projections and the fused ones, initialisations that rewrote the base weights,
and a grid of factors that is not the same modules on every adapted layer. A Ster adapter has
one rank: modules of a smaller rank than the largest are padded with zero rows of A and zero
columns of B, which adds exactly nothing. rsLoRA's scale ``alpha / sqrt(r)`` is folded into the
alpha Ster records (``alpha · sqrt(r)``), so Ster's ``alpha / rank`` gives the same scale.

A PEFT directory carries no checkpoint fingerprint, only the name of the base model it was
trained on (usually a Hub id, where a Ster user often gives a local directory), so the model's
identity cannot be checked: :func:`read_peft_dir` checks every factor's shape against the
model instead, and :func:`peft_model_note` says in a warning when the names differ rather than
refusing, which :func:`ster.engine.model.adapters.artifact.check_for_model` would do.

peft, torch and safetensors are imported lazily, after the directory's files and JSON are checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from ster.engine.model.adapters.artifact import ATTENTION, TARGETS, AdapterSidecar, factor_names, projection_shape
from ster.engine.model.adapters.file import check_factors, check_float, parse_file
from ster.engine.model.config import FAMILIES
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import atomic_directory, check_output_directory, read_json
from ster.engine.protocol.inputs import read_input
from ster.engine.protocol.naming import flag
from ster.engine.protocol.tensorfile import TensorFile

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ster.engine.model.adapters.lora import Adapter
    from ster.engine.model.config import DecoderConfig

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"
SHORT_NAMES = {hf: short for short, hf in TARGETS.items()}
"""Hugging Face projection name → Ster's short name."""
FUSED: dict[str, tuple[str, ...]] = {
    name: tuple(SHORT_NAMES[part] for part in parts)
    for family in FAMILIES.values()
    for name, parts in family.fused.items()
}
"""A fused checkpoint projection → the Ster targets it stacks, in row order (Phi-3's qkv_proj, gate_up_proj)."""
COVERS: dict[str, tuple[str, ...]] = {**{hf: (short,) for hf, short in SHORT_NAMES.items()}, **FUSED}
"""Every module a PEFT factor may adapt → the Ster targets it carries."""
MODULE_OF = {hf: ("self_attn" if covered[0] in ATTENTION else "mlp") for hf, covered in COVERS.items()}
PROJECTIONS = ", ".join(TARGETS.values())
READS_HIDDEN = ("query", "key", "value", "gate", "up")
_KEY = re.compile(r"base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")
"""``init_lora_weights`` values whose initialisation subtracted the first update from the base weights."""
TRAINING_ONLY_VARIANTS = {"velora_config"}
"""LoRA variants that change only the backward pass: the saved factors apply as plain LoRA."""

Names = dict[tuple[int, str, str], tuple[str, list[int]]]
"""(layer, PEFT module, a|b) → (the tensor's name, its shape)."""
Layout = dict[str, list[tuple[str, int]]]
"""A model's fused projections: PEFT module → (Ster target, output rows) of each piece, in row order."""


def peft_key(layer: int, target: str, factor: Literal["a", "b"]) -> str:
    """The name PEFT gives a factor of Ster's ``layers.{layer}.{target}.{factor}`` in adapter_model.safetensors."""
    return module_key(layer, TARGETS[target], factor)


def module_key(layer: int, module: str, factor: Literal["a", "b"]) -> str:
    """The name PEFT gives factor A or B of a module (``q_proj``, ``qkv_proj`` …) of a layer."""
    return f"base_model.model.model.layers.{layer}.{MODULE_OF[module]}.{module}.lora_{factor.upper()}.weight"


# Reading ----------------------------------------------------------------------------------------------------


def read_peft_dir(path: Path, config: DecoderConfig, device: torch.device) -> tuple[AdapterSidecar, Adapter]:
    """The LoRA adapter in a PEFT directory as a Ster sidecar and adapter, every factor checked against the model.

    The sidecar names the PEFT config's base model (empty when it names none), with no fingerprint
    and no training report; pair it with :func:`peft_model_note`, not ``check_for_model``. A fused
    module's factors become its pieces' (A shared, B split by rows); a module of a smaller rank than
    the adapter's is padded with zeros. Everything is checked before a tensor is read.
    """
    lora, weights = _read_config(path)
    file = _read_weights(weights)
    names = _factor_names(path, file.tensors)
    layers, modules = _grid(path, names, lora)
    settings = _module_settings(lora, names)
    rank, alpha = _rank_and_alpha(path, settings, lora.use_rslora)
    _check_shapes(path, names, config, settings, layers)
    _check_values(file, names, settings, lora.use_rslora)
    targets = _targets(modules)
    sidecar = AdapterSidecar(
        kind="adapter",
        model=lora.base_model_name_or_path or "",
        model_fingerprint=None,
        rank=rank,
        alpha=alpha,
        targets=targets,
        layers=layers,
        hidden_size=config.hidden_size,
        train=None,
    )
    pieces = _split(_tensors(file), names, config, rank, layers, modules)
    from ster.engine.model.adapters.lora import Adapter

    tensors = {name: pieces[name] for layer in layers for target in targets for name in factor_names(layer, target)}
    return sidecar, Adapter(sidecar.rank, sidecar.alpha, targets, layers, tensors).to(device)


def peft_document(path: Path) -> tuple[AdapterSidecar, list[tuple[str, list[int], str]]]:
    """A PEFT directory as ``tune inspect`` shows it, without a model: the sidecar it reads as (the width
    taken from the factors that touch the residual stream) and every tensor's PEFT name, shape and dtype.

    The config and the grid of factors are refused as applying it would refuse them; each factor's shape
    against the model is checked once there is one (evaluate, merge, generate).
    """
    lora, weights = _read_config(path)
    file = _read_weights(weights)
    header = file.tensors
    names = _factor_names(path, header)
    layers, modules = _grid(path, names, lora)
    settings = _module_settings(lora, names)
    rank, alpha = _rank_and_alpha(path, settings, lora.use_rslora)
    _check_ranks(path, names, settings)
    _check_values(file, names, settings, lora.use_rslora)
    hidden = next(
        (
            shape[1]
            for (_, module, factor), (_, shape) in sorted(names.items())
            if factor == "a" and COVERS[module][0] in READS_HIDDEN and len(shape) == 2
        ),
        next(
            (shape[0] for (_, _, factor), (_, shape) in sorted(names.items()) if factor == "b" and len(shape) == 2), 0
        ),
    )
    sidecar = AdapterSidecar(
        kind="adapter",
        model=lora.base_model_name_or_path or "",
        model_fingerprint=None,
        rank=rank,
        alpha=alpha,
        targets=_targets(modules),
        layers=layers,
        hidden_size=hidden,
        train=None,
    )
    tensors = [
        (
            names[(layer, module, factor)][0],
            names[(layer, module, factor)][1],
            str(header[names[(layer, module, factor)][0]].get("dtype", "")),
        )
        for layer in layers
        for module in modules
        for factor in ("a", "b")
    ]
    return sidecar, tensors


def peft_model_note(sidecar: AdapterSidecar, model: str, want: Literal["adapter", "reward"] = "adapter") -> str | None:
    """The warning for a PEFT adapter applied to a model of another name; refuses one asked for as a reward model.

    A PEFT directory records no fingerprint, so the name is all there is to compare, and a Hub id
    will rarely equal a local directory's path: :func:`read_peft_dir` has already checked every
    factor's shape against the model, so a differing name is said, not refused.
    """
    if want == "reward":
        raise Refusal("adapter artifact is a generation adapter, not a reward model")
    if sidecar.model == model:
        return None
    named = f'was trained for model "{sidecar.model}"' if sidecar.model else "names no base model"
    return (
        f'PEFT adapter {named} and carries no checkpoint fingerprint, so it is applied to "{model}" on the '
        "strength of its layer shapes matching"
    )


def _read_config(path: Path) -> tuple[Any, Path]:
    """peft's LoraConfig of the directory, and its weights file, after refusing what Ster cannot apply."""
    path = confine.readable(path)  # under a server's root: every file of the directory walked inside it, pinned
    _check_files(path)
    raw = read_json(path / CONFIG_NAME, "PEFT adapter config")
    if not isinstance(raw, dict):
        raise Refusal(f"PEFT adapter config {path / CONFIG_NAME} is not a JSON object")
    kind = raw.get("peft_type")
    if kind is None:
        raise Refusal(f"PEFT adapter config {path / CONFIG_NAME} names no peft_type")
    if str(kind).upper() != "LORA":
        raise Refusal(f"PEFT adapter {path} is of type {kind}; Ster applies LoRA adapters only")
    lora = _parse(raw, path / CONFIG_NAME)
    _check_config(path, lora)
    return lora, path / WEIGHTS_NAME


def _check_files(path: Path) -> None:
    if not path.is_dir():
        raise Refusal(f"PEFT adapter {path} is not a directory")
    if not (path / CONFIG_NAME).is_file():
        raise Refusal(f"directory {path} has no {CONFIG_NAME}, so it is not a PEFT adapter directory")
    if not (path / WEIGHTS_NAME).is_file():
        if (path / PICKLE_NAME).is_file():
            raise Refusal(
                f"PEFT adapter {path} stores its weights as {PICKLE_NAME}, a pickle Ster does not load; "
                "save it again with safe_serialization=True to get adapter_model.safetensors"
            )
        raise Refusal(f"PEFT adapter {path} has no {WEIGHTS_NAME}")


def _parse(raw: dict[str, Any], file: Path) -> Any:
    """The config through peft's own classes; a key this peft does not know is refused when it is set."""
    import peft
    from peft import LoraConfig

    known = {field.name for field in dataclasses.fields(LoraConfig)}
    unknown = sorted(key for key in raw if key not in known and key != "runtime_config")
    set_unknown = [key for key in unknown if raw[key] not in (None, False, {}, [], "")]
    if set_unknown:
        raise Refusal(
            f"PEFT adapter config {file} sets {set_unknown[0]}, which peft {peft.__version__} does not "
            "know, so Ster cannot tell how it changes the update"
        )
    kwargs = {key: value for key, value in raw.items() if key in known}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return LoraConfig.from_peft_type(**LoraConfig.check_kwargs(**kwargs))
    except (TypeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refusal(f"PEFT adapter config {file} is not one peft {peft.__version__} reads: {reason}") from None


def _check_config(path: Path, lora: Any) -> None:
    """Refuse, in one sentence each, a configuration whose update is not ``scale · B A`` on the projections."""
    from peft import LoraConfig

    where = f"PEFT adapter {path}"
    if getattr(lora, "use_dora", False):
        raise Refusal(
            f"{where} uses DoRA (use_dora), whose magnitude vector rescales each projection; Ster "
            "applies plain LoRA only"
        )
    for field in dataclasses.fields(LoraConfig):
        if (
            field.metadata.get("is_lora_variant")
            and field.name not in TRAINING_ONLY_VARIANTS
            and getattr(lora, field.name)
        ):
            raise Refusal(
                f"{where} uses the LoRA variant {field.name}, which changes the update; Ster applies plain LoRA only"
            )
    if lora.modules_to_save:
        raise Refusal(
            f"{where} also trains whole modules ({', '.join(sorted(lora.modules_to_save))}, "
            "modules_to_save), which a Ster adapter cannot carry"
        )
    if lora.bias != "none" or getattr(lora, "lora_bias", False):
        raise Refusal(
            f"{where} trains biases (bias {lora.bias!r}, lora_bias {getattr(lora, 'lora_bias', False)}), "
            "which a Ster adapter cannot carry"
        )
    _check_extras(where, lora)
    _check_targets(where, lora.target_modules)


def _check_extras(where: str, lora: Any) -> None:
    init = lora.init_lora_weights
    if isinstance(init, str) and init.lower().startswith(BASE_REWRITING_INITS):
        raise Refusal(
            f"{where} was initialised with {init}, which rewrites the base weights it trains against; "
            "save it from PEFT with path_initial_model_for_weight_conversion to get a plain LoRA adapter"
        )
    for name, what in (
        ("trainable_token_indices", "trains token embeddings"),
        ("target_parameters", "adapts parameters rather than the projections"),
        ("layer_replication", "replicates layers of the base model"),
        ("use_qalora", "is a quantization-aware (QA-LoRA) adapter"),
    ):
        if getattr(lora, name, None):
            raise Refusal(f"{where} {what} ({name}), which a Ster adapter cannot carry")


def _check_targets(where: str, modules: Any) -> None:
    """A list of modules must name projections; a pattern (or ``all-linear``) is judged by the tensors it made."""
    if modules is None or isinstance(modules, str):
        return
    for module in sorted(modules):
        if str(module).split(".")[-1] not in COVERS:
            raise Refusal(
                f'{where} targets "{module}", which is not one of the seven projections Ster adapts '
                f"({PROJECTIONS}) nor a fused one ({', '.join(FUSED)})"
            )


def _factor_names(path: Path, header: dict[str, dict[str, Any]]) -> Names:
    """(layer, PEFT module, a|b) → (PEFT's name, shape) for every tensor; any other tensor is refused."""
    found: Names = {}
    for name in sorted(header):
        match = _KEY.fullmatch(name)
        if match is None or match[3] not in COVERS or MODULE_OF[match[3]] != match[2]:
            raise Refusal(
                f"PEFT adapter {path} holds tensor {name}, which is not a LoRA factor of one of the seven "
                f"projections Ster adapts ({PROJECTIONS}) nor of a fused one ({', '.join(FUSED)})"
            )
        key = (int(match[1]), match[3], match[4].lower())
        if key in found:
            raise Refusal(f"PEFT adapter {path} holds tensors {found[key][0]} and {name} for the same factor")
        found[key] = (name, list(header[name].get("shape", [])))
    if not found:
        raise Refusal(f"PEFT adapter {path} holds no LoRA factors")
    return found


def _grid(path: Path, names: Names, lora: Any) -> tuple[list[int], list[str]]:
    """The adapted layers and modules: every module on every layer with both factors, as a Ster adapter has them."""
    layers = sorted({layer for layer, _, _ in names})
    modules = sorted({module for _, module, _ in names}, key=lambda module: list(TARGETS).index(COVERS[module][0]))
    for module in modules:
        for piece in COVERS[module] if len(COVERS[module]) > 1 else ():
            if TARGETS[piece] in modules:
                raise Refusal(
                    f"PEFT adapter {path} adapts both {module} and {TARGETS[piece]}, a projection it "
                    "stacks, so their updates would add up on the same rows"
                )
    for layer in layers:
        for module in modules:
            pairs: tuple[tuple[Literal["a", "b"], Literal["a", "b"]], ...] = (("a", "b"), ("b", "a"))
            for factor, other in pairs:
                if (layer, module, factor) not in names:
                    held = names.get((layer, module, other)) or next(
                        entry for (_, m, f), entry in names.items() if m == module and f == factor
                    )
                    raise Refusal(
                        f"PEFT adapter {path} holds {held[0]} but no {module_key(layer, module, factor)}; "
                        "a Ster adapter carries both factors of every target on every adapted layer"
                    )
    listed = lora.layers_to_transform
    if listed is not None:
        listed = sorted({listed} if isinstance(listed, int) else set(listed))
        if listed != layers:
            raise Refusal(
                f"PEFT adapter {path} lists layers {listed} in layers_to_transform but holds factors for "
                f"layers {layers}"
            )
    return layers, modules


def _targets(modules: list[str]) -> list[str]:
    """Ster's targets of the modules, in Ster's order."""
    return [target for module in modules for target in COVERS[module]]


def _module_settings(lora: Any, names: Names) -> dict[tuple[int, str], tuple[int, float]]:
    """(layer, module) → (rank, alpha) as peft gives them to that module: its ``rank_pattern`` and
    ``alpha_pattern`` entries (matched by peft's own rule), else ``r`` and ``lora_alpha``."""
    from peft.utils.other import get_pattern_key

    ranks: dict[str, int] = lora.rank_pattern or {}
    alphas: dict[str, float] = lora.alpha_pattern or {}
    settings: dict[tuple[int, str], tuple[int, float]] = {}
    for (layer, module, factor), (name, _) in names.items():
        if factor == "a":
            key = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            rank = ranks.get(get_pattern_key(list(ranks), key), lora.r)
            alpha = alphas.get(get_pattern_key(list(alphas), key), lora.lora_alpha)
            settings[(layer, module)] = (rank, alpha)
    return settings


def _rank_and_alpha(path: Path, settings: dict[tuple[int, str], tuple[int, float]], rslora: bool) -> tuple[int, float]:
    """The adapter's one rank (the largest module's) and the alpha whose ``alpha / rank`` is every module's scale:
    its ``lora_alpha``, or ``lora_alpha · sqrt(r)`` under rsLoRA; modules scaled otherwise are refused."""
    for rank, alpha in settings.values():
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise Refusal(f"PEFT adapter lora_alpha {alpha} is not a positive finite number")
        if not isinstance(rank, int) or rank < 1:
            raise Refusal(f"PEFT adapter rank {rank} stores nothing")
    (layer, module), (rank, alpha) = max(settings.items(), key=lambda item: (item[1][0], -item[0][0]))
    alpha = float(alpha) * math.sqrt(rank) if rslora else float(alpha)
    for (other_layer, other), (r, a) in sorted(settings.items()):
        scale = a / math.sqrt(r) if rslora else a / r
        if not math.isclose(scale, alpha / rank, rel_tol=1e-9):
            raise Refusal(
                f"PEFT adapter {path} scales {other} on layer {other_layer} by {scale:g} but {module} on "
                f"layer {layer} by {alpha / rank:g} (rank_pattern, alpha_pattern); a Ster adapter has one "
                "scale"
            )
    return rank, alpha


def _check_shapes(
    path: Path,
    names: Names,
    config: DecoderConfig,
    settings: dict[tuple[int, str], tuple[int, float]],
    layers: list[int],
) -> None:
    """Every factor shaped as its rank and the model's projection imply; a fused module only on its family."""
    beyond = [layer for layer in layers if layer >= config.num_hidden_layers]
    if beyond:
        raise Refusal(
            f"PEFT adapter {path} adapts layer {beyond[0]}, but the model has {config.num_hidden_layers} layers"
        )
    alien = sorted({module for _, module, _ in names if module in FUSED and module not in config.family.fused})
    if alien:
        raise Refusal(
            f"PEFT adapter {path} adapts {alien[0]}, a fused projection that a {config.model_type} model does not have"
        )
    for (layer, module, factor), (name, shape) in sorted(names.items()):
        rank = settings[(layer, module)][0]
        out = sum(projection_shape(config, target)[0] for target in COVERS[module])
        inner = projection_shape(config, COVERS[module][0])[1]
        expected = [rank, inner] if factor == "a" else [out, rank]
        if shape != expected:
            raise Refusal(
                f"PEFT adapter tensor {name} has shape {shape}, but rank {rank} on this model's {module} "
                f"implies {expected}; the adapter was made for another model or rank"
            )


def _check_ranks(path: Path, names: Names, settings: dict[tuple[int, str], tuple[int, float]]) -> None:
    """Without a model, what the factors' shapes must be: two axes, A ``rank`` rows and B ``rank`` columns of
    their module's rank, and a module's factors of one shape on every layer."""
    first: dict[tuple[str, str], list[int]] = {}
    for (layer, module, factor), (name, shape) in sorted(names.items()):
        rank, axis = settings[(layer, module)][0], 0 if factor == "a" else 1
        if len(shape) != 2 or shape[axis] != rank or 0 in shape:
            side = "rows" if factor == "a" else "columns"
            raise Refusal(
                f"PEFT adapter tensor {name} has shape {shape}, but rank {rank} gives its {module} factor {rank} {side}"
            )
        seen = first.setdefault((module, factor), shape)
        if shape != seen:
            raise Refusal(
                f"PEFT adapter {path} shapes {name} {shape} where another layer's {module} factor is "
                f"{seen}; a projection has one shape on every layer"
            )


def _read_weights(weights: Path) -> TensorFile:
    """adapter_model.safetensors read wholly: its bytes against its header, every tensor floating-point."""
    file = parse_file(read_input(weights, "PEFT adapter weights"), f"failed to read PEFT adapter weights {weights}: it")
    for name in file.tensors:
        check_float(file, name, "PEFT adapter tensor")
    return file


def _check_values(
    file: TensorFile, names: Names, settings: dict[tuple[int, str], tuple[int, float]], rslora: bool
) -> None:
    """Every factor finite, and no update able to overflow f32 at its module's own scale."""
    for (layer, module), (rank, alpha) in sorted(settings.items()):
        pair = (names[(layer, module, "a")][0], names[(layer, module, "b")][0])
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        check_factors(file.floats(pair[0]), file.floats(pair[1]), scale, pair, "PEFT adapter tensor")


def _tensors(file: TensorFile) -> dict[str, Tensor]:
    """The checked factors as f32 torch tensors (the bytes that were checked, not the file read again)."""
    import numpy as np
    import torch

    return {name: torch.from_numpy(np.array(file.floats(name), dtype=np.float32)) for name in file.tensors}


def _split(
    loaded: dict[str, Tensor], names: Names, config: DecoderConfig, rank: int, layers: list[int], modules: list[str]
) -> dict[str, Tensor]:
    """Ster's factors of every module: f32, padded to ``rank``, a fused module's A given to each piece and its
    B cut by the pieces' rows (their values were checked when the file was read)."""
    import torch

    tensors = {}
    for layer in layers:
        for module in modules:
            a, b = (loaded[names[(layer, module, factor)][0]].to(torch.float32) for factor in ("a", "b"))
            a = torch.cat([a, a.new_zeros(rank - a.shape[0], a.shape[1])])  # [rank, in]
            b = torch.cat([b, b.new_zeros(b.shape[0], rank - b.shape[1])], dim=1)  # [out, rank]
            rows = [projection_shape(config, target)[0] for target in COVERS[module]]
            for target, piece in zip(COVERS[module], b.split(rows), strict=True):
                name_a, name_b = factor_names(layer, target)
                tensors[name_a], tensors[name_b] = a.clone(), piece.contiguous()
    return tensors


# Writing ----------------------------------------------------------------------------------------------------


def model_layout(model: str, revision: str | None = None) -> Layout:
    """The fused projections of the model an adapter was trained on, from its config.json alone: the bundled
    toy, a local directory, or a Hub repository's config.json (the weights are not fetched)."""
    from ster.engine.model.config import load_config

    try:
        return fused_layout(load_config(_config_file(model, revision)))
    except Refusal as exc:
        raise Refusal(
            f"cannot read the config.json of {model}, the model the adapter was trained on, to name its "
            f"projections as PEFT does: {exc}"
        ) from None


def _config_file(model: str, revision: str | None) -> Path:
    from ster.engine.model.resolve import RESERVED, hub_errors, resolve_model

    if model in RESERVED or confine.readable(Path(model).expanduser()).exists():
        return resolve_model(model, revision).config
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError

    with hub_errors(model, revision):
        try:
            return Path(huggingface_hub.hf_hub_download(model, "config.json", revision=revision))
        except HFValidationError:
            raise Refusal(f"model directory {model} does not exist") from None


def fused_layout(config: DecoderConfig) -> Layout:
    """The model's fused projections, each piece's Ster target with its rows (empty for most families)."""
    return {
        module: [(SHORT_NAMES[part], projection_shape(config, SHORT_NAMES[part])[0]) for part in parts]
        for module, parts in config.family.fused.items()
    }


def peft_modules(targets: list[str], layout: Layout | None = None) -> list[tuple[str, list[str]]]:
    """The modules PEFT names for Ster's targets, in Ster's order: a fused projection once, with the
    targets it carries in its row order; every other target as its own projection."""
    pieces = {target: module for module, parts in (layout or {}).items() for target, _ in parts}
    modules: dict[str, list[str]] = {}
    for target in sorted(targets, key=list(TARGETS).index):
        modules.setdefault(pieces.get(target, TARGETS[target]), []).append(target)
    return list(modules.items())


def write_peft_dir(
    output_dir: Path, sidecar: AdapterSidecar, tensors: dict[str, Tensor], base_model: str, layout: Layout | None = None
) -> list[str]:
    """Write the adapter as a PEFT directory, atomically, into a new or empty ``output_dir``; the files' names.

    ``tensors`` are Ster's ``layers.{l}.{target}.a|b``; ``layout`` (:func:`model_layout`) the base model's
    fused projections, whose pieces' factors are joined into one LoRA as the module docstring says.
    ``layers_to_transform`` is always written: the adapter alone does not say whether its layers are all
    of the model's, and the explicit list is right either way (PEFT then creates factors on those layers only).
    """
    from safetensors.torch import save

    if sidecar.kind == "reward":
        raise Refusal("adapter artifact is a reward model, not a generation adapter")
    check_output_directory(output_dir, flag("output"))
    modules = peft_modules(sidecar.targets, layout)
    config = json.dumps(peft_config(sidecar, base_model, modules), indent=2, sort_keys=True)
    state = {}
    for layer in sidecar.layers:
        for module, carried in modules:
            a, b = _joined(layer, module, carried, tensors, (layout or {}).get(module))
            state[module_key(layer, module, "a")], state[module_key(layer, module, "b")] = a, b
    data = save(state, metadata={"format": "pt"})
    with atomic_directory(output_dir) as tmp:
        (tmp / CONFIG_NAME).write_text(config, encoding="utf-8")
        (tmp / WEIGHTS_NAME).write_bytes(data)
    return [CONFIG_NAME, WEIGHTS_NAME]


def _joined(
    layer: int, module: str, carried: list[str], tensors: dict[str, Tensor], parts: list[tuple[str, int]] | None
) -> tuple[Tensor, Tensor]:
    """A module's (A, B), f32 on the CPU: a target's own factors, or for a fused projection A stacking the
    carried targets' A and B block-diagonal, each target's B in its piece's rows and its A's columns."""
    import torch

    own = {
        target: [tensors[name].detach().to("cpu").float() for name in factor_names(layer, target)] for target in carried
    }
    if parts is None:
        return own[carried[0]][0].contiguous(), own[carried[0]][1].contiguous()
    a = torch.cat([own[target][0] for target in carried])  # [k·r, in]
    rank = a.shape[0] // len(carried)
    b = torch.zeros(sum(rows for _, rows in parts), a.shape[0])  # [q + k + v rows, k·r]
    offset = 0
    for target, rows in parts:
        if target in own:
            if own[target][1].shape[0] != rows:
                raise Refusal(
                    f"adapter tensor {factor_names(layer, target)[1]} has {own[target][1].shape[0]} rows, "
                    f"but the model's {TARGETS[target]} has {rows}"
                )
            column = carried.index(target) * rank
            b[offset : offset + rows, column : column + rank] = own[target][1]
        offset += rows
    return a.contiguous(), b


def peft_config(
    sidecar: AdapterSidecar, base_model: str, modules: list[tuple[str, list[str]]] | None = None
) -> dict[str, Any]:
    """adapter_config.json as ``LoraConfig.save_pretrained`` writes it, with target_modules in a fixed order;
    a fused module carrying k targets gets rank ``k·r`` and alpha ``k·alpha`` by pattern, so its scale is r's."""
    from peft import LoraConfig

    def number(value: float) -> int | float:
        return int(value) if float(value).is_integer() else value

    modules = modules if modules is not None else peft_modules(sidecar.targets)
    joined = {module: len(carried) for module, carried in modules if len(carried) > 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (peft annotates lora_alpha as int, but stores and reads any number: a Ster alpha need not be whole)
        config = LoraConfig(
            task_type="CAUSAL_LM",
            r=sidecar.rank,
            lora_alpha=cast(int, number(sidecar.alpha)),
            target_modules=[module for module, _ in modules],
            rank_pattern={module: k * sidecar.rank for module, k in joined.items()},
            alpha_pattern={module: number(k * sidecar.alpha) for module, k in joined.items()},
            layers_to_transform=list(sidecar.layers),
            lora_dropout=0.0,
            bias="none",
            base_model_name_or_path=base_model,
            inference_mode=True,
        )
    document = config.to_dict()
    for key, value in document.items():
        if isinstance(value, set):
            document[key] = sorted(value)
    return document
