"""The ``extract`` job: last-token residual states of a prompt set, written as a versioned JSON document."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from ster.engine.model.adapters.apply import adapted, check_adapter
from ster.engine.model.config import MAX_LAYERS
from ster.engine.model.context import encode_each
from ster.engine.model.loading import model_store
from ster.engine.model.requests import Precision
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import ACTIVATIONS, check_output_file, first_error, load_document, write_json
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.requests import ExtractRequest

SCHEMA_VERSION: Literal[1] = 1


class PromptSet(BaseModel):
    """An input prompt file: ``{"prompts": ["...", ...]}``."""

    model_config = ConfigDict(extra="ignore")
    prompts: list[str]

    @field_validator("prompts")
    @classmethod
    def _non_empty(cls, prompts: list[str]) -> list[str]:
        if not prompts:
            raise ValueError("it contains no prompts")
        for index, prompt in enumerate(prompts):
            if not prompt.strip():
                raise ValueError(f"prompt {index} is empty")
        return prompts


class ExtractRecord(BaseModel):
    prompt: str
    tokens: int
    """How many tokens the prompt encoded to (after the chat template, when applied)."""
    layers: dict[str, list[float]]
    """Layer index (as a string) → the last token's state after that block, f32 values."""

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, tokens: int) -> int:
        if tokens < 1:
            raise ValueError(f"a prompt encodes to at least one token, not {tokens}")
        return tokens

    @field_validator("layers")
    @classmethod
    def _layer_keys(cls, layers: dict[str, list[float]]) -> dict[str, list[float]]:
        for key in layers:
            if not (key.isascii() and key.isdigit() and int(key) < MAX_LAYERS):
                raise ValueError(f'layer "{key}" is not a layer index (0 to {MAX_LAYERS - 1})')
        return layers


class ActivationDocument(BaseModel):
    """The file ``ster extract`` writes."""

    schema_version: Literal[1] = SCHEMA_VERSION
    product: Literal["ster"] = "ster"
    model: str
    model_revision: str | None
    hidden_size: int
    precision: Precision
    chat_template: Literal["applied", "absent", "off"]
    adapter: str | None = None
    """The LoRA adapter the states were read through (null: the bare checkpoint, and in older documents)."""
    records: list[ExtractRecord]

    @model_validator(mode="after")
    def _states(self) -> ActivationDocument:
        """Every state finite and as wide as the model."""
        if self.hidden_size < 1:
            raise ValueError(f"hidden_size {self.hidden_size} is not a width; it must be at least 1")
        for record in self.records:
            for layer, values in record.layers.items():
                if len(values) != self.hidden_size:
                    raise ValueError(
                        f"the state at layer {layer} for prompt {record.prompt!r} has {len(values)} "
                        f"values, but hidden_size is {self.hidden_size}"
                    )
                if not all(math.isfinite(v) for v in values):
                    raise ValueError(f"the state at layer {layer} for prompt {record.prompt!r} is not finite")
        return self


class ExtractResult(BaseModel):
    """What ``ster extract`` prints: where the document went and what it holds (not the floats)."""

    output: str
    model: str
    model_revision: str | None
    prompts: int
    layers: list[int]
    hidden_size: int
    precision: str
    chat_template: str
    adapter: str | None


def extract_job(request: ExtractRequest, ctx: JobContext) -> ExtractResult:
    prompts = load_document(request.input, PromptSet, "input").prompts
    check_output_file(request.output, ACTIVATIONS, ctx.log)
    checkpoint = model_store(ctx).open(request, ctx)
    layers = LayerSpec.parse(request.layers).resolve(checkpoint.config.num_hidden_layers)
    sequences = encode_each(checkpoint.codec, prompts, checkpoint.context, "prompt")
    adapter = check_adapter(ctx, request.adapter, checkpoint)
    from ster.engine.steering.activations import read_last_states  # torch, once every input has been checked
    from ster.engine.steering.floats import f32_values

    decoder = model_store(ctx).decoder(checkpoint, ctx)

    def on_batch(done: int, total: int) -> None:
        ctx.progress("read", f"reading prompt {done}/{total}", done, total)

    with adapted(ctx, decoder, adapter, checkpoint):
        states = read_last_states(
            decoder,
            sequences,
            layers,
            batch_size=request.batch_size,
            on_batch=on_batch,
            check_cancelled=ctx.check_cancelled,
        ).numpy()
    records = [
        ExtractRecord(
            prompt=prompt,
            tokens=len(ids),
            layers={str(layer): f32_values(states[i, j]) for j, layer in enumerate(layers)},
        )
        for i, (prompt, ids) in enumerate(zip(prompts, sequences))
    ]
    ctx.check_cancelled()
    try:
        document = ActivationDocument(
            model=checkpoint.source.model,
            model_revision=checkpoint.source.revision,
            hidden_size=checkpoint.config.hidden_size,
            precision=request.precision,
            chat_template=checkpoint.chat_template,
            adapter=str(request.adapter) if adapter else None,
            records=records,
        )
    except ValidationError as exc:
        raise Refusal(f"nothing was written: {first_error(exc)}") from None
    write_json(request.output, document)
    return ExtractResult(
        output=str(request.output),
        model=document.model,
        model_revision=document.model_revision,
        prompts=len(records),
        layers=layers,
        hidden_size=document.hidden_size,
        precision=request.precision,
        chat_template=document.chat_template,
        adapter=document.adapter,
    )
