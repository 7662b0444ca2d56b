"""The ``bake`` job: an intervention written in the form another engine runs.

* ``checkpoint``: a standalone checkpoint directory in the family's own layout (config, safetensors,
  tokenizer, chat template, generation config), the intervention folded into the weights, and
  ``ster-bake.json`` beside them saying what was baked.

  - An ablation is, in Ster, a change of what writes into the residual stream (see
    :mod:`ster.engine.steering.intervention`): the embedding's rows and each edited block's two writers lose
    ``w`` of their component along the direction. Folded in, that is ``E ← E − w·(E v)·vᵀ`` and
    ``W ← W − w·u·(uᵀW)`` on each attention output and MLP down projection (and their biases), with ``u = v``,
    or ``g ⊙ v`` normalised for a family that normalises each write by a scale ``g`` before adding it (Gemma
    3). The baked weights compute exactly what live ablation computes, at any weights and sites.
  - Steering, a constant ``s·v`` added after block L, is a bias on block L's last writer, the MLP down
    projection: transformers has that option for Llama (``mlp_bias``); any other family is refused, naming the
    formats that carry it.
  - A tied embedding is untied (``tie_word_embeddings: false``, the old matrix as ``lm_head.weight``), since the
    output head must not lose the direction too.
* ``lora``: an ablation as a rank-1 PEFT LoRA per writer (``ΔW = −w·u·(uᵀW)``), the embedding's by PEFT's
  embedding LoRA: the same change of weights as the checkpoint, loaded with ``peft.PeftModel`` or in engines
  that take per-request LoRA.
* ``llama-cpp``: a control-vector GGUF (steering only: llama.cpp adds; see
  :mod:`ster.engine.steering.control_vector`), the strength folded in.
* ``lm-eval``: the steering file of lm-evaluation-harness's ``steered`` model, ``{hookpoint:
  {steering_vector, steering_coefficient, action, bias, head_index}}``, on the module names lm-eval hooks in
  the base model: ``add`` after ``layers.L`` for steering; ``clamp`` on ``embed_tokens`` and after each layer
  for a clamp; for an ablation a clamp to 0 of ``embed_tokens`` and of each layer's ``self_attn.o_proj`` and
  ``mlp.down_proj`` (lm-eval's clamp sets the whole component, so only weight 1 has a place there).
  ``language_model.`` comes first for Gemma 3's multimodal checkpoints.

Everything that can be refused is refused before torch is imported: the model (a native family, its files),
the artifact (for this model), the mode against the format, the weights against lm-eval's clamp, the output.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from ster.engine.model.checkpoint_files import WEIGHTS, copy_checkpoint_files, shard_headers
from ster.engine.model.config import FAMILIES, DecoderConfig, decoder_name, load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.resolve import ModelSource, resolve_model
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import atomic_directory, check_output_directory, check_output_file, write_atomic
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.kinds import CONTROL_VECTOR
from ster.engine.protocol.naming import flag
from ster.engine.steering.artifact import SteeringArtifact, check_against_model, load_artifact
from ster.engine.steering.generate import as_calibrated, given_strength, row_plan
from ster.engine.steering.intervention import EMBEDDING, Edit, Mode, Plan
from ster.engine.steering.requests import FORMAT_MODES, BakeRequest

if TYPE_CHECKING:
    import torch

SIDECAR = "ster-bake.json"
"""What a baked checkpoint or LoRA directory records of its making, beside its weights."""
ADDS_BY_BIAS = ("llama",)
"""The families whose transformers layout has a bias option on the MLP down projection (``mlp_bias``)."""
WRITERS = ("self_attn.o_proj", "mlp.down_proj")
"""The projections of a block that write into the residual stream, as its checkpoint names them."""
POST_NORMS = {"self_attn.o_proj": "post_attention_layernorm", "mlp.down_proj": "post_feedforward_layernorm"}
"""With sandwich norms (Gemma 3), the norm each writer's output passes through before it is added."""


class BakedSite(BaseModel):
    """What was folded in at one site."""

    direction_layer: int
    """The artifact layer whose direction was used."""
    add: float = 0.0
    weight: float = 0.0
    target: float = 0.0


class BakeRecord(BaseModel):
    """``ster-bake.json``: a baked checkpoint's or LoRA's making."""

    product: str = "ster"
    kind: Literal["baked intervention"] = "baked intervention"
    model: str
    """The checkpoint the intervention was folded into."""
    model_revision: str | None
    model_fingerprint: str
    vector: str
    trait_name: str
    mode: Mode
    format: str
    strength: float
    strength_unit: str
    sites: dict[str, BakedSite]
    """Per site (``embedding`` or a block's index)."""
    note: str
    """What the baked form computes, in a sentence (in every case, what live editing in Ster computes)."""


class BakeResult(BaseModel):
    """What ``ster bake`` prints."""

    record: BakeRecord
    output: str
    files: list[str]
    """What the output holds (a directory's files, or the file itself)."""
    fingerprint: str | None = None
    """The baked checkpoint's own fingerprint (``checkpoint``); it differs from the base's."""


def bake_job(request: BakeRequest, ctx: JobContext) -> BakeResult:
    ctx.progress("resolve", f"resolving model {request.model}")
    source = resolve_model(request.model, request.revision)
    if source.warning:
        ctx.warn(source.warning)
    config = load_config(source.config)
    if request.format in ("checkpoint", "lora") and config.model_type not in FAMILIES:
        raise Refusal(
            f"{flag('format')} {request.format} writes the layouts of the native families, and {source.model} is "
            f"a {config.model_type}; {flag('format')} llama-cpp or lm-eval carries a direction to any model"
        )
    fingerprint = checkpoint_fingerprint(config, source.weights)
    artifact = load_artifact(request.vector)
    note = check_against_model(artifact, source.model, fingerprint, config.hidden_size, config.num_hidden_layers)
    if note is not None:
        ctx.log(note)
    request = as_calibrated(request, artifact, ctx)
    if request.mode not in FORMAT_MODES[request.format]:  # the artifact's calibrated mode, which the format lacks
        raise Refusal(
            f"{flag('format')} {request.format} carries {' and '.join(FORMAT_MODES[request.format])} only, and the "
            f"artifact is calibrated to {request.mode}; give {flag('mode')} to bake another"
        )
    strength = given_strength(request, ctx, artifact)
    plan = row_plan(artifact, request, strength, config.num_hidden_layers, ctx)
    if not plan:
        raise Refusal("this intervention edits nothing (every weight is 0), so there is nothing to bake")
    sentence = _exactness(request)
    _check_format(request, config, plan, source)
    _check_output(request)
    record = BakeRecord(
        model=source.model,
        model_revision=source.revision,
        model_fingerprint=fingerprint,
        vector=str(request.vector),
        trait_name=artifact.trait_name,
        mode=request.mode,
        format=request.format,
        strength=strength.value,
        strength_unit=strength.unit,
        sites=_sites(plan, artifact),
        note=sentence,
    )
    ctx.progress("bake", f"baking the {request.mode} intervention at {len(plan)} sites as {request.format}")
    if request.format == "checkpoint":
        files, baked = _write_checkpoint(ctx, source, config, plan, request.output, record)
        ctx.log(f"baked {len(plan)} sites into {request.output}; its fingerprint is {baked}")
        return BakeResult(record=record, output=str(request.output), files=files, fingerprint=baked)
    if request.format == "lora":
        files = _write_lora(source, config, plan, request.output, record)
    elif request.format == "llama-cpp":
        from ster.engine.steering.control_vector import write_control_vector

        write_control_vector(request.output, {site: _vector(edit) for site, edit in plan.items()}, config.model_type)
        files = [request.output.name]
    else:
        write_atomic(request.output, _lm_eval_file(source, config, plan))
        files = [request.output.name]
    return BakeResult(record=record, output=str(request.output), files=files)


def _sites(plan: Plan, artifact: SteeringArtifact) -> dict[str, BakedSite]:
    layer_of = {tuple(v.vector): v.layer for v in artifact.vectors}
    return {
        ("embedding" if site == EMBEDDING else str(site)): BakedSite(
            direction_layer=layer_of[edit.direction], add=edit.add, weight=edit.weight, target=edit.target
        )
        for site, edit in sorted(plan.items())
    }


def _exactness(request: BakeRequest) -> str:
    """What the baked form computes, in a sentence: live editing, exactly, in every case ``bake`` writes."""
    if request.format in ("llama-cpp", "lm-eval"):
        return f"the intervention as {request.format} applies it at run time: the same edit at the same sites"
    if request.mode == "add":
        return "a constant added after each steered block, as a bias on its MLP down projection"
    return "each edited writer's weights made to write nothing along the direction, as live ablation does"


def _check_format(request: BakeRequest, config: DecoderConfig, plan: Plan, source: ModelSource) -> None:
    if request.format == "checkpoint" and request.mode == "add" and config.model_type not in ADDS_BY_BIAS:
        raise Refusal(
            f"{config.model_type}'s layout in transformers has no bias on the MLP down projection to carry an added "
            f"direction, so steering cannot be baked into its checkpoint; {flag('format')} llama-cpp or lm-eval "
            "carries it"
        )
    if request.format == "lora":
        names = {decoder_name(config, name) for name in shard_headers(source.weights)}
        biased = sorted(
            f"model.layers.{site}.{writer}.bias"
            for site, edit in plan.items()
            if edit.on_writes
            for writer in WRITERS
            if f"model.layers.{site}.{writer}.bias" in names
        )
        if biased:
            raise Refusal(
                f"a LoRA changes weights, not biases, and this model's writers carry biases ({biased[0]}), which "
                f"an ablation changes too; {flag('format')} checkpoint carries it"
            )
    if request.format == "lm-eval" and any(edit.projects and edit.weight != 1.0 for edit in plan.values()):
        raise Refusal(
            "lm-eval's clamp sets the whole component along the direction, so a weight other than 1 (a profile, "
            f"or a partial ablation) has no place in its steering file; {flag('format')} checkpoint or lora "
            "carries it"
        )
    assert request.mode in FORMAT_MODES[request.format]  # the request refused the others


def _check_output(request: BakeRequest) -> None:
    if request.format in ("checkpoint", "lora"):
        check_output_directory(request.output, flag("output"))
    elif request.format == "llama-cpp":
        check_output_file(request.output, CONTROL_VECTOR, what=flag("output"))
    else:
        check_output_file(request.output, "lm-eval steering file", what=flag("output"))


def _vector(edit: Edit) -> list[float]:
    """An added edit's vector, its strength folded in."""
    return [edit.add * x for x in edit.direction]


# checkpoint -------------------------------------------------------------------------------------------------


def _write_checkpoint(
    ctx: JobContext, source: ModelSource, config: DecoderConfig, plan: Plan, output: Path, record: BakeRecord
) -> tuple[list[str], str]:
    """Every tensor of the source into one file, the writers at the plan's sites edited; the source's other
    files, the config changed where the bake needs it; and the sidecar. The files and the new fingerprint."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shards = shard_headers(source.weights)
    names = {decoder_name(config, name): name for name in shards}
    tied = config.tie_word_embeddings and "lm_head.weight" not in names
    state: dict[str, torch.Tensor] = {}
    for number, path in enumerate(source.weights, start=1):
        ctx.check_cancelled()
        ctx.progress("bake", f"reading {path.name} ({number}/{len(source.weights)})", number, len(source.weights))
        with safe_open(str(path), framework="pt", device="cpu") as weights:
            for name in weights.keys():
                state[name] = weights.get_tensor(name)
    if tied and EMBEDDING in plan:
        embedding = names["model.embed_tokens.weight"]
        state[_head_name(embedding)] = state[embedding].clone()
    for canonical, tensor in _edited(config, plan, {key: state[name] for key, name in names.items() if key}).items():
        state[names.get(canonical) or canonical] = tensor  # a new bias: only Llama takes one, unrenamed
    with atomic_directory(output) as staging:
        save_file({k: v.contiguous() for k, v in state.items()}, str(staging / WEIGHTS), metadata={"format": "pt"})
        files = [WEIGHTS, *copy_checkpoint_files(source, staging)]
        _edit_config(staging / "config.json", untie=tied and EMBEDDING in plan, mlp_bias=record.mode == "add")
        (staging / SIDECAR).write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
        files.append(SIDECAR)
        baked = checkpoint_fingerprint(load_config(staging / "config.json"), (staging / WEIGHTS,))
    return sorted(files), baked


def _head_name(embedding: str) -> str:
    """Where an untied output head goes, beside the embedding's own name in the checkpoint's layout."""
    for prefix, head in (
        ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"),
        ("model.language_model.embed_tokens.weight", "lm_head.weight"),
    ):
        if embedding == prefix:
            return head
    return "lm_head.weight"


def _edited(config: DecoderConfig, plan: Plan, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors the plan changes, by decoder name (new biases included), each in its writer's dtype."""
    import torch

    changed: dict[str, torch.Tensor] = {}
    for site, edit in sorted(plan.items()):
        if not edit.projects:
            continue
        v = torch.tensor(edit.direction, dtype=torch.float64)
        if site == EMBEDDING:  # Gemma's embedding scale multiplies every row alike, so it commutes with this
            changed["model.embed_tokens.weight"] = _rows_without(tensors["model.embed_tokens.weight"], v, edit.weight)
            continue
        for writer in WRITERS:
            base = f"model.layers.{site}.{writer}"
            against = _as_written(config, v, lambda name: tensors[name], site, writer)
            changed[f"{base}.weight"] = _columns_without(tensors[f"{base}.weight"], against, edit.weight)
            if f"{base}.bias" in tensors:
                changed[f"{base}.bias"] = _columns_without(tensors[f"{base}.bias"][:, None], against, edit.weight)[:, 0]
    if any(edit.add for edit in plan.values()):  # mlp_bias on: every MLP projection has a bias, 0 but for s·v
        for layer in range(config.num_hidden_layers):
            for part in ("gate_proj", "up_proj", "down_proj"):
                weight = tensors[f"model.layers.{layer}.mlp.{part}.weight"]
                name = f"model.layers.{layer}.mlp.{part}.bias"
                bias = tensors[name].double() if name in tensors else torch.zeros(weight.shape[0], dtype=torch.float64)
                there = plan.get(layer)
                if part == "down_proj" and there is not None and there.add:
                    bias = bias + there.add * torch.tensor(there.direction, dtype=torch.float64)
                changed[name] = bias.to(weight.dtype)
    return changed


def _as_written(
    config: DecoderConfig, v: torch.Tensor, read: Callable[[str], torch.Tensor], layer: int, writer: str
) -> torch.Tensor:
    """The direction a writer's output must lose for the stream to gain nothing along ``v``: ``v`` itself, or
    where the block normalises the write by a scale ``g`` before adding it, ``g ⊙ v`` normalised (the write is
    then ``norm(x) ⊙ g``, orthogonal to ``v`` exactly when ``x`` is orthogonal to ``g ⊙ v``)."""
    if not config.family.sandwich_norms:
        return v
    gain = read(f"model.layers.{layer}.{POST_NORMS[writer]}.weight").double() + config.family.norm_offset
    return (gain * v) / (gain * v).norm()


def _columns_without(weight: torch.Tensor, v: torch.Tensor, share: float) -> torch.Tensor:
    """``W − share·v·(vᵀW)`` for a writer ``W`` [D, in] whose outputs go along the stream's D."""
    w = weight.double()
    return (w - share * torch_outer(v, v @ w)).to(weight.dtype)


def _rows_without(table: torch.Tensor, v: torch.Tensor, share: float) -> torch.Tensor:
    """``E − share·(E v)·vᵀ`` for an embedding [V, D]: each row loses its component along v."""
    e = table.double()
    return (e - share * torch_outer(e @ v, v)).to(table.dtype)


def torch_outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[:, None] * b[None, :]


def _edit_config(path: Path, untie: bool, mlp_bias: bool) -> None:
    """The copied config.json with the bake's changes: the head untied, the MLP's biases on."""
    if not (untie or mlp_bias):
        return
    raw = json.loads(path.read_text(encoding="utf-8"))
    for place in (raw, raw.get("text_config")):
        if isinstance(place, dict):
            if untie:
                place["tie_word_embeddings"] = False
            if mlp_bias:
                place["mlp_bias"] = True
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# lora -------------------------------------------------------------------------------------------------------


def _write_lora(source: ModelSource, config: DecoderConfig, plan: Plan, output: Path, record: BakeRecord) -> list[str]:
    """The ablation as rank-1 LoRA factors on the writers (and the embedding), a PEFT directory."""
    import torch
    from safetensors.torch import save

    from ster.engine.model.adapters.peft_format import CONFIG_NAME, WEIGHTS_NAME

    tensor = _reader(source, config)
    paths = _module_paths(source)
    state: dict[str, torch.Tensor] = {}
    targets: list[str] = []

    for site, edit in sorted(plan.items()):
        v = torch.tensor(edit.direction, dtype=torch.float64)
        if site == EMBEDDING:
            table = tensor("model.embed_tokens.weight")  # [V, D]
            scale = _embed_scale(config, table.dtype)
            module = paths["model.embed_tokens"]
            state[f"base_model.model.{module}.lora_embedding_A"] = (table @ v)[None, :].float()  # [1, V]
            state[f"base_model.model.{module}.lora_embedding_B"] = (-edit.weight * scale * v)[:, None].float()
            targets.append(module)
            continue
        for writer in WRITERS:
            base = f"model.layers.{site}.{writer}"
            against = _as_written(config, v, tensor, site, writer)
            weight = tensor(f"{base}.weight")  # [D, in]
            module = paths[base]
            state[f"base_model.model.{module}.lora_A.weight"] = (against @ weight)[None, :].float()  # [1, in]
            state[f"base_model.model.{module}.lora_B.weight"] = (-edit.weight * against)[:, None].float()  # [D, 1]
            targets.append(module)
    document = _lora_config(source.model, targets)
    with atomic_directory(output) as staging:
        (staging / CONFIG_NAME).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (staging / WEIGHTS_NAME).write_bytes(save(state, metadata={"format": "pt"}))
        (staging / SIDECAR).write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return sorted([CONFIG_NAME, WEIGHTS_NAME, SIDECAR])


def _embed_scale(config: DecoderConfig, dtype: torch.dtype) -> float:
    """What an embedding LoRA's output must be multiplied by to match the base embedding's scaled rows (Gemma
    multiplies by ``sqrt(hidden_size)``): 1 where PEFT applies the base layer's scale to it itself (its
    ``_get_embed_scale``, in the PEFT this project pins), the scale where an older PEFT would not."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not config.family.embed_scale or hasattr(BaseTunerLayer, "_get_embed_scale"):
        return 1.0
    return float(torch.tensor(config.hidden_size**0.5).to(dtype))


def _module_paths(source: ModelSource) -> dict[str, str]:
    """Decoder name of a module (``model.layers.3.mlp.down_proj``) → its path in transformers' model of the
    checkpoint, which PEFT's keys name (a multimodal Gemma 3 holds it under ``model.language_model``): read off
    the model built on the meta device, so no weight is loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(source.root)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    paths: dict[str, str] = {}
    for path, _ in model.named_modules():
        for marker in ("embed_tokens", "layers."):
            at = path.find(marker)
            if at >= 0 and "vision" not in path:
                paths["model." + path[at:]] = path
    return paths


def _lora_config(base_model: str, targets: list[str]) -> dict[str, Any]:
    """adapter_config.json as ``LoraConfig.save_pretrained`` writes it: rank 1, alpha 1 (a scale of 1), every
    writer named in full."""
    from peft import LoraConfig

    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=1,
        lora_alpha=1,
        target_modules=sorted(set(targets)),
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


# lm-eval ----------------------------------------------------------------------------------------------------


def _lm_eval_file(source: ModelSource, config: DecoderConfig, plan: Plan) -> bytes:
    """lm-eval's steering file (``torch.save`` of a dict), hookpoints named as lm-eval finds them among the base
    model's modules: a block's output (``layers.L``) for steering and clamping, each of its writers
    (``layers.L.self_attn.o_proj``, ``layers.L.mlp.down_proj``) for an ablation, clamped to 0."""
    import torch

    prefix = "language_model." if config.family.text_config else ""
    read = _reader(source, config)
    document: dict[str, dict[str, Any]] = {}

    def put(hookpoint: str, vector: torch.Tensor, coefficient: float, action: str) -> None:
        document[prefix + hookpoint] = {
            "steering_vector": vector.float(),
            "steering_coefficient": coefficient,
            "action": action,
            "bias": None,
            "head_index": None,
        }

    for site, edit in sorted(plan.items()):
        v = torch.tensor(edit.direction, dtype=torch.float64)
        if site == EMBEDDING:
            put("embed_tokens", v, edit.target, "clamp")
        elif edit.on_writes:
            for writer in WRITERS:
                put(f"layers.{site}.{writer}", _as_written(config, v, read, site, writer), 0.0, "clamp")
        elif edit.projects:
            put(f"layers.{site}", v, edit.target, "clamp")
        else:
            put(f"layers.{site}", v, edit.add, "add")
    buffer = io.BytesIO()
    torch.save(document, buffer)
    return buffer.getvalue()


def _reader(source: ModelSource, config: DecoderConfig) -> Callable[[str], torch.Tensor]:
    """Read one tensor of the checkpoint by its decoder name (f64)."""
    from safetensors import safe_open

    shards = shard_headers(source.weights)
    names = {decoder_name(config, name): name for name in shards}

    def read(canonical: str) -> torch.Tensor:
        name = names[canonical]
        with safe_open(str(shards[name][0]), framework="pt", device="cpu") as weights:
            return weights.get_tensor(name).double()

    return read
