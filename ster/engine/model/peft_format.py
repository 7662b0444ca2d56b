"""LoRA adapter directories in PEFT's format, read and written: the interchange with the Hugging Face ecosystem.

A PEFT directory holds ``adapter_config.json`` (a :class:`peft.LoraConfig`) and
``adapter_model.safetensors``, whose tensors are named after the module they adapt in a
``transformers`` causal LM (``base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight``:
A ``[r, in]``, ``lora_B.weight``: B ``[out, r]``). These are the same factors a Ster adapter
holds as ``layers.{l}.query.a|b``; only the names and the config differ, so both directions
are a renaming, with peft's own config class doing the parsing and the writing of the JSON.

What a Ster adapter cannot express is refused in one sentence each: other PEFT methods, DoRA
and the other LoRA variants that change the update, per-module ranks or alphas, extra
trainable modules, biases, modules other than the seven projections, initialisations that
rewrote the base weights, and a grid of factors that is not the same targets on every
adapted layer. rsLoRA's scale ``alpha / sqrt(r)`` is folded into the alpha Ster records
(``alpha · sqrt(r)``), so Ster's ``alpha / rank`` gives the same scale.

A PEFT directory carries no checkpoint fingerprint, only the name of the base model it was
trained on (usually a Hub id, where a Ster user often gives a local directory), so the model's
identity cannot be checked: :func:`read_peft_dir` checks every factor's shape against the
model instead, and :func:`peft_model_note` says in a warning when the names differ rather than
refusing, which :func:`ster.engine.model.adapter.check_for_model` would do.

peft, torch and safetensors are imported lazily, after the directory's files and JSON are checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ster.engine.model.adapter import (
    TARGETS,
    AdapterSidecar,
    factor_names,
    projection_shape,
    safetensors_header,
)
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import (
    atomic_directory,
    check_output_directory,
    read_json,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ster.engine.model.config import LlamaConfig
    from ster.engine.model.lora import Adapter

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"
SHORT_NAMES = {hf: short for short, hf in TARGETS.items()}
"""Hugging Face projection name → Ster's short name."""
MODULE_OF = {hf: ("self_attn" if hf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp") for hf in SHORT_NAMES}
PROJECTIONS = ", ".join(TARGETS.values())
_KEY = re.compile(r"base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")
"""``init_lora_weights`` values whose initialisation subtracted the first update from the base weights."""
TRAINING_ONLY_VARIANTS = {"velora_config"}
"""LoRA variants that change only the backward pass: the saved factors apply as plain LoRA."""


def peft_key(layer: int, target: str, factor: Literal["a", "b"]) -> str:
    """The name PEFT gives a factor of Ster's ``layers.{layer}.{target}.{factor}`` in adapter_model.safetensors."""
    hf = TARGETS[target]
    return f"base_model.model.model.layers.{layer}.{MODULE_OF[hf]}.{hf}.lora_{factor.upper()}.weight"


# Reading ----------------------------------------------------------------------------------------------------


def read_peft_dir(path: Path, config: LlamaConfig, device: torch.device) -> tuple[AdapterSidecar, Adapter]:
    """The LoRA adapter in a PEFT directory as a Ster sidecar and adapter, every factor checked against the model.

    The sidecar names the PEFT config's base model (empty when it names none), with no fingerprint
    and no training report; pair it with :func:`peft_model_note`, not ``check_for_model``.
    """
    import torch

    lora, weights = _read_config(path)
    names = _factor_names(path, safetensors_header(weights))
    layers, targets = _grid(path, names, lora)
    _check_shapes(path, names, config, lora.r, layers)
    sidecar = AdapterSidecar(kind="adapter", model=lora.base_model_name_or_path or "", model_fingerprint=None,
                             rank=lora.r, alpha=_effective_alpha(lora), targets=targets, layers=layers,
                             hidden_size=config.hidden_size, train=None)
    loaded = _load_tensors(weights)
    tensors = {}
    for layer in layers:
        for target in targets:
            for factor, name in zip(("a", "b"), factor_names(layer, target), strict=True):
                key = names[(layer, target, factor)][0]
                tensors[name] = loaded[key].to(torch.float32)
                if not torch.isfinite(tensors[name]).all():
                    raise Refusal(f"PEFT adapter tensor {key} contains a non-finite value")
    from ster.engine.model.lora import Adapter

    return sidecar, Adapter(sidecar.rank, sidecar.alpha, targets, layers, tensors).to(device)


def peft_document(path: Path) -> tuple[AdapterSidecar, list[tuple[str, list[int], str]]]:
    """A PEFT directory as ``tune inspect`` shows it, without a model: the sidecar it reads as (the width
    taken from the factors that touch the residual stream) and every tensor's PEFT name, shape and dtype.

    The config and the grid of factors are refused as applying it would refuse them; each factor's shape
    against the model is checked once there is one (evaluate, merge, generate).
    """
    lora, weights = _read_config(path)
    header = safetensors_header(weights)
    names = _factor_names(path, header)
    layers, targets = _grid(path, names, lora)
    hidden = next((shape[1] for (_, target, factor), (_, shape) in sorted(names.items())
                   if factor == "a" and target in ("query", "key", "value", "gate", "up") and len(shape) == 2),
                  next((shape[0] for (_, target, factor), (_, shape) in sorted(names.items())
                        if factor == "b" and len(shape) == 2), 0))
    sidecar = AdapterSidecar(kind="adapter", model=lora.base_model_name_or_path or "", model_fingerprint=None,
                             rank=lora.r, alpha=_effective_alpha(lora), targets=targets, layers=layers,
                             hidden_size=hidden, train=None)
    tensors = [(names[(layer, target, factor)][0], names[(layer, target, factor)][1],
                str(header[names[(layer, target, factor)][0]].get("dtype", "")))
               for layer in layers for target in targets for factor in ("a", "b")]
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
    return (f'PEFT adapter {named} and carries no checkpoint fingerprint, so it is applied to "{model}" on the '
            "strength of its layer shapes matching")


def _read_config(path: Path) -> tuple[Any, Path]:
    """peft's LoraConfig of the directory, and its weights file, after refusing what Ster cannot apply."""
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
            raise Refusal(f"PEFT adapter {path} stores its weights as {PICKLE_NAME}, a pickle Ster does not load; "
                          "save it again with safe_serialization=True to get adapter_model.safetensors")
        raise Refusal(f"PEFT adapter {path} has no {WEIGHTS_NAME}")


def _parse(raw: dict[str, Any], file: Path) -> Any:
    """The config through peft's own classes; a key this peft does not know is refused when it is set."""
    import peft
    from peft import LoraConfig

    known = {field.name for field in dataclasses.fields(LoraConfig)}
    unknown = sorted(key for key in raw if key not in known and key != "runtime_config")
    set_unknown = [key for key in unknown if raw[key] not in (None, False, {}, [], "")]
    if set_unknown:
        raise Refusal(f"PEFT adapter config {file} sets {set_unknown[0]}, which peft {peft.__version__} does not "
                      "know, so Ster cannot tell how it changes the update")
    kwargs = {key: value for key, value in raw.items() if key in known}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return LoraConfig.from_peft_type(**LoraConfig.check_kwargs(**kwargs))
    except (TypeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refusal(f"PEFT adapter config {file} is not one peft {peft.__version__} reads: {reason}") from None


def _check_config(path: Path, lora: Any) -> None:
    """Refuse, in one sentence each, a configuration whose update is not ``scale · B A`` on the seven projections."""
    from peft import LoraConfig

    where = f"PEFT adapter {path}"
    if getattr(lora, "use_dora", False):
        raise Refusal(f"{where} uses DoRA (use_dora), whose magnitude vector rescales each projection; Ster "
                      "applies plain LoRA only")
    for field in dataclasses.fields(LoraConfig):
        if field.metadata.get("is_lora_variant") and field.name not in TRAINING_ONLY_VARIANTS \
                and getattr(lora, field.name):
            raise Refusal(f"{where} uses the LoRA variant {field.name}, which changes the update; Ster applies "
                          "plain LoRA only")
    if lora.rank_pattern or lora.alpha_pattern:
        raise Refusal(f"{where} gives some modules their own rank or alpha (rank_pattern, alpha_pattern); a Ster "
                      "adapter has one rank and one alpha")
    if lora.modules_to_save:
        raise Refusal(f"{where} also trains whole modules ({', '.join(sorted(lora.modules_to_save))}, "
                      "modules_to_save), which a Ster adapter cannot carry")
    if lora.bias != "none" or getattr(lora, "lora_bias", False):
        raise Refusal(f"{where} trains biases (bias {lora.bias!r}, lora_bias {getattr(lora, 'lora_bias', False)}), "
                      "which a Ster adapter cannot carry")
    _check_extras(where, lora)
    _check_targets(where, lora.target_modules)


def _check_extras(where: str, lora: Any) -> None:
    init = lora.init_lora_weights
    if isinstance(init, str) and init.lower().startswith(BASE_REWRITING_INITS):
        raise Refusal(f"{where} was initialised with {init}, which rewrites the base weights it trains against; "
                      "save it from PEFT with path_initial_model_for_weight_conversion to get a plain LoRA adapter")
    for name, what in (("trainable_token_indices", "trains token embeddings"),
                       ("target_parameters", "adapts parameters rather than the projections"),
                       ("layer_replication", "replicates layers of the base model"),
                       ("use_qalora", "is a quantization-aware (QA-LoRA) adapter")):
        if getattr(lora, name, None):
            raise Refusal(f"{where} {what} ({name}), which a Ster adapter cannot carry")


def _check_targets(where: str, modules: Any) -> None:
    """A list of modules must name projections; a pattern (or ``all-linear``) is judged by the tensors it made."""
    if modules is None or isinstance(modules, str):
        return
    for module in sorted(modules):
        if str(module).split(".")[-1] not in SHORT_NAMES:
            raise Refusal(f'{where} targets "{module}", which is not one of the seven projections Ster adapts '
                          f"({PROJECTIONS})")


def _factor_names(path: Path, header: dict[str, dict[str, Any]]) -> dict[tuple[int, str, str], tuple[str, list[int]]]:
    """(layer, short target, a|b) → (PEFT's name, shape) for every tensor; any other tensor is refused."""
    found: dict[tuple[int, str, str], tuple[str, list[int]]] = {}
    for name in sorted(header):
        match = _KEY.fullmatch(name)
        if match is None or match[3] not in SHORT_NAMES or MODULE_OF[match[3]] != match[2]:
            raise Refusal(f"PEFT adapter {path} holds tensor {name}, which is not a LoRA factor of one of the seven "
                          f"projections Ster adapts ({PROJECTIONS})")
        key = (int(match[1]), SHORT_NAMES[match[3]], match[4].lower())
        if key in found:
            raise Refusal(f"PEFT adapter {path} holds tensors {found[key][0]} and {name} for the same factor")
        found[key] = (name, list(header[name].get("shape", [])))
    if not found:
        raise Refusal(f"PEFT adapter {path} holds no LoRA factors")
    return found


def _grid(path: Path, names: dict[tuple[int, str, str], tuple[str, list[int]]],
          lora: Any) -> tuple[list[int], list[str]]:
    """The adapted layers and targets: every target on every layer with both factors, as a Ster adapter has them."""
    layers = sorted({layer for layer, _, _ in names})
    targets = [t for t in TARGETS if any(target == t for _, target, _ in names)]
    for layer in layers:
        for target in targets:
            for factor, other in (("a", "b"), ("b", "a")):
                if (layer, target, factor) not in names:
                    held = names.get((layer, target, other)) or next(
                        entry for (_, t, f), entry in names.items() if t == target and f == factor)
                    raise Refusal(f"PEFT adapter {path} holds {held[0]} but no {peft_key(layer, target, factor)}; "
                                  "a Ster adapter carries both factors of every target on every adapted layer")
    listed = lora.layers_to_transform
    if listed is not None:
        listed = sorted({listed} if isinstance(listed, int) else set(listed))
        if listed != layers:
            raise Refusal(f"PEFT adapter {path} lists layers {listed} in layers_to_transform but holds factors for "
                          f"layers {layers}")
    return layers, targets


def _check_shapes(path: Path, names: dict[tuple[int, str, str], tuple[str, list[int]]], config: LlamaConfig,
                  rank: int, layers: list[int]) -> None:
    """Every factor shaped as the config's rank and the model's projection imply."""
    beyond = [layer for layer in layers if layer >= config.num_hidden_layers]
    if beyond:
        raise Refusal(f"PEFT adapter {path} adapts layer {beyond[0]}, but the model has {config.num_hidden_layers} "
                      "layers")
    for (_, target, factor), (name, shape) in sorted(names.items()):
        out, inner = projection_shape(config, target)
        expected = [rank, inner] if factor == "a" else [out, rank]
        if shape != expected:
            raise Refusal(f"PEFT adapter tensor {name} has shape {shape}, but rank {rank} on this model's "
                          f"{TARGETS[target]} implies {expected}; the adapter was made for another model or rank")


def _effective_alpha(lora: Any) -> float:
    """The alpha whose ``alpha / r`` is PEFT's scale: ``lora_alpha``, or ``lora_alpha · sqrt(r)`` under rsLoRA."""
    alpha = float(lora.lora_alpha)
    if not (math.isfinite(alpha) and alpha > 0):
        raise Refusal(f"PEFT adapter lora_alpha {lora.lora_alpha} is not a positive finite number")
    if lora.r < 1:
        raise Refusal(f"PEFT adapter rank {lora.r} stores nothing")
    return alpha * math.sqrt(lora.r) if lora.use_rslora else alpha


def _load_tensors(weights: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(weights))
    except (OSError, SafetensorError):
        raise Refusal(f"failed to read PEFT adapter weights {weights}") from None


# Writing ----------------------------------------------------------------------------------------------------


def write_peft_dir(output_dir: Path, sidecar: AdapterSidecar, tensors: dict[str, Tensor], base_model: str) -> list[str]:
    """Write the adapter as a PEFT directory, atomically, into a new or empty ``output_dir``; the files' names.

    ``tensors`` are Ster's ``layers.{l}.{target}.a|b``. ``layers_to_transform`` is always written:
    the adapter alone does not say whether its layers are all of the model's, and the explicit
    list is right either way (PEFT then creates factors on those layers only).
    """
    from safetensors.torch import save

    if sidecar.kind == "reward":
        raise Refusal("adapter artifact is a reward model, not a generation adapter")
    check_output_directory(output_dir, "--output")
    config = json.dumps(peft_config(sidecar, base_model), indent=2, sort_keys=True)
    state = {}
    for layer in sidecar.layers:
        for target in sidecar.targets:
            for factor, name in zip(("a", "b"), factor_names(layer, target), strict=True):
                state[peft_key(layer, target, factor)] = tensors[name].detach().to("cpu").float().contiguous()
    data = save(state, metadata={"format": "pt"})
    with atomic_directory(output_dir) as tmp:
        (tmp / CONFIG_NAME).write_text(config, encoding="utf-8")
        (tmp / WEIGHTS_NAME).write_bytes(data)
    return [CONFIG_NAME, WEIGHTS_NAME]


def peft_config(sidecar: AdapterSidecar, base_model: str) -> dict[str, Any]:
    """adapter_config.json as ``LoraConfig.save_pretrained`` writes it, with target_modules in a fixed order."""
    from peft import LoraConfig

    alpha = int(sidecar.alpha) if float(sidecar.alpha).is_integer() else sidecar.alpha
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = LoraConfig(task_type="CAUSAL_LM", r=sidecar.rank, lora_alpha=alpha,
                            target_modules=[TARGETS[t] for t in sidecar.targets],
                            layers_to_transform=list(sidecar.layers), lora_dropout=0.0, bias="none",
                            base_model_name_or_path=base_model, inference_mode=True)
    document = config.to_dict()
    for key, value in document.items():
        if isinstance(value, set):
            document[key] = sorted(value)
    return document
