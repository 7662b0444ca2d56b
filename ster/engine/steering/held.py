"""Reading and steering a transformers model the caller already holds (``ster.steer``, ``ster.read``).

A researcher with a ``PreTrainedModel`` in a notebook wants Ster's directions on it without handing the model
over. The model is seen through the transformers path's view (:class:`~ster.engine.model.generic.GenericDecoder`
built without adapter hooks, so nothing is added to the model), and edited by the same hooks, with the same
plan, as ``ster generate`` edits it (:func:`~ster.engine.steering.generate.row_plan`,
:class:`~ster.engine.steering.apply.RowEdits`): the same logits as Ster's own steered decoder. ``ster.steer``
applies the edits with ``RowEdits.applied``, whose hooks live exactly as long as its ``with`` block and are
removed in ``finally`` whatever happens inside it.

An artifact is checked against the model's width and block count only: a model held in memory carries no
checkpoint whose fingerprint could be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ster.engine.model.config import DecoderConfig, decoder_config_of
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.artifact import SteeringArtifact
from ster.engine.steering.generate import as_calibrated, default_strength, row_plan
from ster.engine.steering.intervention import Plan
from ster.engine.steering.layers import LayerSpec
from ster.engine.steering.requests import InterventionFields
from ster.engine.steering.strength import Strength

if TYPE_CHECKING:
    from torch import Tensor

    from ster.engine.model.generic import GenericDecoder
    from ster.engine.steering.apply import RowEdits

WHERE = "of the model you passed"


def held_config(model: Any) -> DecoderConfig:
    """The decoder fields of a transformers model object, refused in one sentence when it is not one."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise Refusal(
            f"expected a transformers causal language model (a PreTrainedModel), got a {type(model).__name__}"
        )
    return decoder_config_of(config, str(getattr(config, "model_type", "") or "unknown"), WHERE.removeprefix("of "))


def view(model: Any) -> GenericDecoder:
    """The model behind Ster's decoder interface, changing nothing on it."""
    from ster.engine.model.generic import GenericDecoder

    return GenericDecoder(held_config(model), model, hosts_adapters=False)


def check_fits(artifact: SteeringArtifact, config: DecoderConfig) -> None:
    """Refuse an artifact whose width or layers this model does not have."""
    if artifact.hidden_size != config.hidden_size:
        raise Refusal(f"artifact width {artifact.hidden_size} does not match the width {config.hidden_size} {WHERE}")
    for entry in artifact.vectors:
        if not 0 <= entry.layer < config.num_hidden_layers:
            raise Refusal(
                f"artifact has a vector for layer {entry.layer}, but the model you passed has layers "
                f"0..{config.num_hidden_layers - 1}"
            )


def held_plan(
    artifact: SteeringArtifact,
    config: DecoderConfig,
    strength: Strength | None,
    fields: InterventionFields,
    ctx: JobContext,
) -> Plan:
    """The plan ``ster generate`` would apply with these fields, at the strength given, else the one it takes when
    given none (the artifact's calibrated one, else the mode's default: the rule every front end shows)."""
    check_fits(artifact, config)
    fields = as_calibrated(fields, artifact, ctx)
    chosen = strength if strength is not None else default_strength(fields.mode, artifact)
    return row_plan(artifact, fields, chosen, config.num_hidden_layers, ctx)


def prepared(
    model: Any, artifact: SteeringArtifact, strength: Strength | None, fields: InterventionFields, ctx: JobContext
) -> tuple[GenericDecoder, RowEdits | None]:
    """The model's view and the edits ``ster generate`` would make with these fields (None: none, at strength 0),
    every check made; ``edits.applied(view)`` then edits every forward of ``model`` inside a block."""
    from ster.engine.steering.apply import RowEdits

    seen = view(model)
    plan = held_plan(artifact, seen.config, strength, fields, ctx)
    return seen, RowEdits.of(seen, [plan])


def read(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str] | Sequence[Sequence[int]],
    layers: str | Sequence[int] | None,
    batch_size: int,
    ctx: JobContext,
) -> dict[int, Tensor]:
    """The residual state after each of ``layers`` (all blocks by default) at each text's last token, as Ster
    reads a pair's states: per layer an [N, D] f32 tensor on the CPU. Texts are encoded by ``tokenizer`` as it
    encodes by default; lists of token ids are read as they are."""
    from ster.engine.steering.activations import read_last_states

    if isinstance(texts, str) or not texts:
        raise Refusal("texts must be a non-empty list of strings or of token id lists")
    if batch_size < 1:
        raise Refusal(f"batch_size must be 1 or more; got {batch_size}")
    seen = view(model)
    blocks = seen.config.num_hidden_layers
    chosen = _layers(layers, blocks)
    sequences = [_ids(tokenizer, text) for text in texts]
    states = read_last_states(
        seen,
        sequences,
        chosen,
        batch_size=batch_size,
        on_batch=lambda done, total: ctx.progress("read", f"read {done} of {total} texts", done, total),
        check_cancelled=ctx.check_cancelled,
    )
    return {layer: states[:, column] for column, layer in enumerate(chosen)}


def _layers(layers: str | Sequence[int] | None, blocks: int) -> list[int]:
    if layers is None:
        return list(range(blocks))
    if isinstance(layers, str):
        return LayerSpec.parse(layers).resolve(blocks)
    chosen = sorted({int(layer) for layer in layers})
    if not chosen or not 0 <= chosen[0] <= chosen[-1] < blocks:
        raise Refusal(f"layers must name blocks of the model, 0..{blocks - 1}; got {list(layers)}")
    return chosen


def _ids(tokenizer: Any, text: str | Sequence[int]) -> list[int]:
    if isinstance(text, str):
        if tokenizer is None:
            raise Refusal("reading texts needs the model's tokenizer; pass tokenizer=, or pass token ids")
        ids = list(tokenizer(text)["input_ids"])
    else:
        ids = [int(token) for token in text]
    if not ids:
        raise Refusal("a text encodes to no tokens, so there is no last token to read")
    return ids
