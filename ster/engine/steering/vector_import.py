"""The ``vector import`` job: a llama.cpp or repeng control vector read into a steering artifact.

A control vector is one vector per block, its strength folded in, and nothing else: no fingerprint of the
model it was made for, no trait, no record of how it was fitted. The artifact keeps each direction at unit
length and its length as ``vector_norm``, with ``strength_unit: "vector"``, so ``1x`` adds the vector as it
was (what llama.cpp adds at scale 1), ``0.5x`` half of it, and every other command reads it like any
artifact. ``--model`` binds it: the file's width and blocks are checked against that model and the
artifact records its fingerprint, with a warning that nothing else could be checked. Nothing here imports
torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ster.engine.model.config import load_config
from ster.engine.model.fingerprint import checkpoint_fingerprint
from ster.engine.model.resolve import resolve_model
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import check_output_file
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.kinds import ARTIFACT
from ster.engine.steering.artifact import ArtifactSummary, LayerVector, SteeringArtifact, save_artifact, summarize
from ster.engine.steering.control_vector import ControlVector, read_control_vector
from ster.engine.steering.requests import VectorImportRequest


def import_job(request: VectorImportRequest, ctx: JobContext) -> ArtifactSummary:
    path = request.control_vector
    found = read_control_vector(path)
    metadata = {"imported_from": str(path), **({"model_hint": found.model_hint} if found.model_hint else {})}
    artifact = bound_artifact(
        ctx,
        found,
        f"control vector {path}",
        "a control vector",
        request.model,
        request.revision,
        request.trait_name or path.stem,
        metadata,
        before_writing=lambda: check_output_file(request.output, ARTIFACT, ctx.log),
    )
    save_artifact(request.output, artifact)
    ctx.log(f"imported {len(artifact.vectors)} directions into {request.output}; 1x adds each vector as it was")
    return summarize(artifact)


def bound_artifact(
    ctx: JobContext,
    found: ControlVector,
    what: str,
    kind: str,
    model: str,
    revision: str | None,
    trait_name: str,
    metadata: dict[str, str],
    before_writing: Callable[[], None] = lambda: None,
) -> SteeringArtifact:
    """Vectors made elsewhere (``what``: a control vector file, another library's object; ``kind``: what such a
    thing is) as an artifact bound to ``model``, after checking their width and blocks against it: each
    direction at unit length, its length kept as ``vector_norm`` with ``strength_unit: "vector"``."""
    ctx.progress("resolve", f"resolving model {model}")
    source = resolve_model(model, revision)
    if source.warning:
        ctx.warn(source.warning)
    config = load_config(source.config)
    if found.width != config.hidden_size:
        raise Refusal(
            f"{what} is {found.width} wide, and {source.model}'s residual stream is "
            f"{config.hidden_size}: it was made for another model"
        )
    beyond = [block for block in found.layers if block >= config.num_hidden_layers]
    if beyond:
        raise Refusal(
            f"{what} holds a direction for block {beyond[0]}, and {source.model} has blocks "
            f"0..{config.num_hidden_layers - 1}: it was made for another model"
        )
    if found.model_hint and found.model_hint != config.model_type:
        ctx.warn(f"{what} names a {found.model_hint} model, and {source.model} is a {config.model_type}")
    ctx.warn(
        f"{kind} records no fingerprint of the model it was made for, so nothing but its width and its "
        f"blocks could be checked against {source.model}; the artifact is bound to it on your word"
    )
    before_writing()
    vectors = []
    for block, values in sorted(found.layers.items()):
        length = math.sqrt(math.fsum(x * x for x in values))
        if length == 0:
            ctx.log(f"block {block}'s vector is all zeros, so it adds nothing and is left out")
            continue
        vectors.append(LayerVector(layer=block, vector=[x / length for x in values], vector_norm=length))
    if not vectors:
        raise Refusal(f"{what} holds only zero vectors, so there is no direction to import")
    return SteeringArtifact(
        model=source.model,
        model_revision=source.revision,
        model_fingerprint=checkpoint_fingerprint(config, source.weights),
        trait_name=trait_name,
        method="imported",
        hidden_size=config.hidden_size,
        metadata=metadata,
        vectors=vectors,
        strength_unit="vector",
    )
