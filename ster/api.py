"""Ster from Python: the same jobs as the ``ster`` command, for notebooks and scripts.

```python
import ster

model = ster.open("ster:toy")                                  # loads the weights once
summary = model.train("direction.json", pairs="ster:pairs")
with model.steering("direction.json", strength="0.4x"):
    print(model.generate("Tell me about your day.").text)
```

Every method runs the job the command of the same name runs (``model.train`` is ``ster train --model …``),
with the same checks and the same defaults: a keyword left out (``None``) is a flag not given, so the request's
own default applies. Each returns the job's document as its typed pydantic object, whose
``model_dump(mode="json")`` is what ``ster --json`` prints as the result's ``data``.

- **Errors.** A refused input raises :class:`SterError` whose message is the command's one sentence, and the
  job writes nothing. A bug in Ster raises :class:`SterError` too, its message saying ``internal error in``,
  with the original exception chained.
- **Progress.** ``progress=`` takes a callable, called on the calling thread with each event as it comes
  (:class:`~ster.engine.protocol.events.Progress`, ``Token``, ``Warning``, ``Log``); ``True`` shows a progress
  bar (in a terminal or a notebook); ``False`` nothing; ``None`` (the default) a bar where stderr is a terminal
  or the code runs in a notebook with ipywidgets installed. Warnings are also raised as Python warnings (:class:`SterWarning`) and log
  sentences go to the ``ster`` logger.
- **Ctrl-C.** ``KeyboardInterrupt`` (a notebook's interrupt) cancels the job as the command's Ctrl-C does: it
  stops at its next step, writes nothing (a tune run leaves the checkpoint it resumes from), and the interrupt is
  raised again once it has stopped, with the job's sentence.
- **Threads.** Jobs run one at a time on one thread of their own, whichever thread calls.

:func:`steer` and :func:`read` work on a transformers model you already hold instead, and :func:`to_repeng`,
:func:`to_steering_vectors` and :func:`from_peer` convert directions to and from the two Python peers.
``import ster`` imports neither torch nor transformers; opening a model does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Union

from ster.engine.protocol.errors import Cancelled, Refusal, SterError

if TYPE_CHECKING:
    from pydantic import BaseModel
    from torch import Tensor
    from typing_extensions import Unpack

    from ster.engine.model.gguf_import import ImportResult
    from ster.engine.model.loading import Checkpoint, ModelStore
    from ster.engine.protocol.events import Event
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.artifact import ArtifactSummary, SteeringArtifact
    from ster.engine.steering.bake import BakeResult
    from ster.engine.steering.direction_jobs import EvaluateResult, OptimizeResult
    from ster.engine.steering.extract import ExtractResult
    from ster.engine.steering.generate import GenerateResult
    from ster.engine.steering.sweep import SweepResult
    from ster.engine.tune.evaluate import EvaluateReport, PairEvaluateReport
    from ster.engine.tune.inspect import InspectResult
    from ster.engine.tune.merge import MergeResult
    from ster.engine.tune.peft_interop import ExportPeftResult
    from ster.engine.tune.train import TrainResult

__all__ = [
    "Cancelled",
    "GenerateOptions",
    "InterventionOptions",
    "Model",
    "Refusal",
    "SamplingOptions",
    "SterError",
    "SterWarning",
    "TuneOptions",
    "export_peft",
    "from_peer",
    "import_model",
    "inspect",
    "inspect_adapter",
    "load_artifact",
    "open",
    "read",
    "steer",
    "to_repeng",
    "to_steering_vectors",
]

PathLike = str | os.PathLike[str]
Strength = float | str
"""A steering strength as the command spells it: ``3`` (the residual stream's units) or ``"0.4x"`` (times each
layer's activation norm or spread)."""
Vector = Union[PathLike, "SteeringArtifact"]
"""An artifact: its path, or the object (written to a temporary file for a job that reads a path)."""
Progress = Union[Callable[["Event"], None], bool, None]  # noqa: UP007
Mode = Literal["add", "ablate", "clamp"]

logger = logging.getLogger("ster")


class SterWarning(UserWarning):
    """A warning a job gave (the command prints it as ``warning: …``); the job went on."""


class InterventionOptions(TypedDict, total=False):
    """How a direction is applied, as ``ster generate``'s flags of the same names say (``--mode``, ``--layers``,
    ``--direction-layer``, ``--peak-weight``, ``--peak-layer``, ``--min-weight``, ``--falloff``)."""

    mode: Mode
    layers: str
    direction_layer: int
    peak_weight: float
    peak_layer: float
    min_weight: float
    falloff: float


class SamplingOptions(TypedDict, total=False):
    """How tokens are drawn (``--temperature``, ``--top-p``, ``--seed``)."""

    temperature: float
    top_p: float
    seed: int


class GenerateOptions(InterventionOptions, SamplingOptions, total=False):
    """The options of :meth:`Model.generate` and :meth:`Model.sweep`: the intervention's and the sampling's."""


class TuneOptions(TypedDict, total=False):
    """What every ``ster tune`` objective shares: the adapter's shape and the optimiser's schedule."""

    rank: int
    alpha: float
    targets: str
    layers: str
    epochs: int
    learning_rate: float
    accumulation: int
    warmup_steps: int
    max_sequence: int
    batch_size: int
    seed: int
    checkpoint_every: int
    resume: bool


MODEL_FIELDS = ("model", "revision", "precision", "device", "chat_template")
"""The request fields :func:`open` fixes for every job of the model."""


def open(
    model: PathLike,
    *,
    revision: str | None = None,
    precision: Literal["f32", "f16", "bf16", "int8"] | None = None,
    device: str | None = None,
    chat_template: Literal["auto", "on", "off"] | None = None,
    progress: Progress = None,
) -> Model:
    """Resolve and load ``model`` (a checkpoint directory, a Hub id, or ``ster:toy``), once, for every job of the
    returned :class:`Model`; ``--revision``, ``--precision``, ``--device`` and ``--chat-template`` as the commands
    take them. Refused in the commands' sentence when it cannot be loaded."""
    return Model(
        str(model),
        {"revision": revision, "precision": precision, "device": device, "chat_template": chat_template},
        progress,
    )


class Model:
    """A loaded model and the jobs that run on it; made by :func:`open`."""

    def __init__(self, name: str, fields: dict[str, Any], progress: Progress = None) -> None:
        from ster.engine.model.loading import ModelStore
        from ster.engine.model.requests import ModelRequest
        from ster.engine.protocol.requests import build_request

        self.progress: Progress = progress
        """How this model's jobs report progress unless a call says otherwise (see :mod:`ster.api`)."""
        self._given = {"model": name, **{key: value for key, value in fields.items() if value is not None}}
        request = _built(lambda: build_request(ModelRequest, **self._given))
        self._store: ModelStore = ModelStore()
        self._steering: dict[str, Any] | None = None
        self._scratch: Path | None = None

        def load(ctx: JobContext) -> Checkpoint:
            checkpoint = self._store.open(request, ctx)
            self._store.decoder(checkpoint, ctx)
            return checkpoint

        self._checkpoint: Checkpoint = _run_on_worker("open", load, progress, self._store)

    def __repr__(self) -> str:
        return f"<ster.Model {self.name} ({self.model_type}, {self.num_layers} layers, width {self.hidden_size})>"

    @property
    def name(self) -> str:
        """The model as resolved (a Hub id, a directory, ``ster:toy``)."""
        return self._checkpoint.source.model

    @property
    def model_type(self) -> str:
        return self._checkpoint.config.model_type

    @property
    def hidden_size(self) -> int:
        """The residual stream's width."""
        return self._checkpoint.config.hidden_size

    @property
    def num_layers(self) -> int:
        """The number of decoder blocks (an artifact's layers are 0 to this less one)."""
        return self._checkpoint.config.num_hidden_layers

    @property
    def chat_template(self) -> str:
        """How prompts are encoded: ``applied``, ``absent`` or ``off``."""
        return self._checkpoint.chat_template

    # reading, fitting, evaluating

    def extract(
        self,
        input: PathLike,
        output: PathLike,
        *,
        layers: str | None = None,
        batch_size: int | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
    ) -> ExtractResult:
        """Read hidden states at the last token of each prompt in ``input`` into the activation file ``output``
        (``ster extract``; :func:`read` returns them as tensors from a transformers model you hold)."""
        return self._job("extract", _given(locals()), progress)

    def train(
        self,
        output: PathLike,
        *,
        pairs: PathLike | None = None,
        method: Literal["caa", "pca", "logistic"] | None = None,
        layers: str | None = None,
        batch_size: int | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
    ) -> ArtifactSummary:
        """Fit one direction per layer on contrastive pairs and write the artifact ``output`` (``ster train``)."""
        return self._job("train", _given(locals()), progress)

    def optimize(
        self,
        output: PathLike,
        *,
        pairs: PathLike | None = None,
        layers: str | None = None,
        batch_size: int | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
    ) -> OptimizeResult:
        """Fit every method at every layer, score each on a holdout, and write the best (``ster optimize``)."""
        return self._job("optimize", _given(locals()), progress)

    def calibrate(
        self,
        output: PathLike,
        *,
        pairs: PathLike | None = None,
        holdout: PathLike | None = None,
        neutral: PathLike | None = None,
        kl_budget: float | None = None,
        trials: int | None = None,
        seed: int | None = None,
        layers: str | None = None,
        resume: bool | None = None,
        batch_size: int | None = None,
        judge: str | None = None,
        judge_question: str | None = None,
        mode: Literal["add", "ablate"] | None = None,
        refusal_markers: PathLike | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
    ) -> ArtifactSummary:
        """Choose the layer and strength (or ablation profile) within a KL budget, and write the calibrated artifact
        ``output`` (``ster calibrate``); the document is the artifact's summary with what was chosen."""
        return self._job("calibrate", _given(locals()), progress)

    def evaluate(
        self,
        vector: Vector,
        *,
        pairs: PathLike | None = None,
        batch_size: int | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
    ) -> EvaluateResult:
        """Score an artifact's directions on pairs, layer by layer (``ster evaluate``)."""
        return self._job("evaluate", _given(locals()), progress)

    # generating

    def generate(
        self,
        prompt: str,
        *,
        vector: Vector | None = None,
        strength: Strength | None = None,
        max_new_tokens: int | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerateResult:
        """Generate from ``prompt``: unsteered, steered by ``vector``, through ``adapter``, or both
        (``ster generate``). Inside :meth:`steering`, a call that names no vector is steered as the block says."""
        fields = _given({**locals(), **options})
        if self._steering is not None and vector is None:
            fields = {**self._steering, **fields}
        return self._job("generate", fields, progress)

    def sweep(
        self,
        vector: Vector,
        *,
        strengths: Sequence[Strength] | str | None = None,
        prompts: PathLike | None = None,
        prompt_texts: Sequence[str] | None = None,
        max_new_tokens: int | None = None,
        neutral: PathLike | None = None,
        neutral_count: int | None = None,
        holdout: PathLike | None = None,
        kl_budget: float | None = None,
        adapter: PathLike | None = None,
        progress: Progress = None,
        **options: Unpack[GenerateOptions],
    ) -> SweepResult:
        """Generate at a ladder of strengths side by side and measure each (``ster sweep``)."""
        fields = _given({**locals(), **options})
        if isinstance(strengths, list | tuple):
            fields["strengths"] = list(strengths)
        if isinstance(prompt_texts, list | tuple):
            fields["prompt_texts"] = list(prompt_texts)
        return self._job("sweep", fields, progress)

    @contextlib.contextmanager
    def steering(
        self, vector: Vector, *, strength: Strength | None = None, **options: Unpack[InterventionOptions]
    ) -> Iterator[Model]:
        """Every :meth:`generate` inside the block that names no vector of its own is steered by ``vector`` at
        ``strength`` (and ``mode``, ``layers`` and the profile as ``ster generate`` takes them); blocks nest, the
        inner one steering inside it. The artifact and the fields are checked on entry."""
        fields = _given({"vector": vector, "strength": strength, **options})
        from ster.engine.protocol.requests import build_request
        from ster.engine.steering.requests import GenerateRequest

        _built(lambda: build_request(GenerateRequest, **{**self._given, **self._paths(fields), "prompt": "-"}))
        outer, self._steering = self._steering, fields
        try:
            yield self
        finally:
            self._steering = outer

    # writing for other engines

    def bake(
        self,
        vector: Vector,
        output: PathLike,
        *,
        format: Literal["checkpoint", "lora", "llama-cpp", "lm-eval"] | None = None,
        strength: Strength | None = None,
        progress: Progress = None,
        **options: Unpack[InterventionOptions],
    ) -> BakeResult:
        """Write the steered model for another engine: a checkpoint (vLLM, transformers), a LoRA, llama.cpp's
        control vector or lm-eval's steering file (``ster bake``)."""
        return self._job("bake", _given({**locals(), **options}), progress)

    def import_vector(
        self, source: PathLike | Any, output: PathLike, *, trait_name: str | None = None, progress: Progress = None
    ) -> ArtifactSummary:
        """An artifact ``output`` bound to this model from a llama.cpp or repeng control-vector GGUF (``ster vector
        import``), or from a repeng ``ControlVector`` or steering-vectors ``SteeringVector`` object."""
        if isinstance(source, str | os.PathLike):
            return self._job("vector import", {"control_vector": source, **_given(locals(), "source")}, progress)
        artifact = from_peer(source, self, trait_name=trait_name, progress=progress)
        return _run_on_worker(
            "vector import", lambda ctx: _saved(artifact, Path(output), ctx), _progress_of(progress, self), None
        )

    # LoRA post-training

    def sft(
        self, examples: PathLike, output: PathLike, *, progress: Progress = None, **options: Unpack[TuneOptions]
    ) -> TrainResult:
        """Supervised fine-tuning of a LoRA adapter on prompt/completion examples (``ster tune sft``)."""
        return self._job("tune sft", _given({**locals(), **options}), progress)

    def dpo(
        self,
        output: PathLike,
        *,
        pairs: PathLike | None = None,
        beta: float | None = None,
        loss: Literal["sigmoid", "ipo"] | None = None,
        progress: Progress = None,
        **options: Unpack[TuneOptions],
    ) -> TrainResult:
        """Direct preference optimisation (or IPO with ``loss="ipo"``) on chosen/rejected pairs (``ster tune dpo``)."""
        return self._job("tune dpo", _given({**locals(), **options}), progress)

    def reward(
        self,
        output: PathLike,
        *,
        pairs: PathLike | None = None,
        progress: Progress = None,
        **options: Unpack[TuneOptions],
    ) -> TrainResult:
        """A reward model: a LoRA and a scalar head trained on preference pairs (``ster tune reward``)."""
        return self._job("tune reward", _given({**locals(), **options}), progress)

    def grpo(
        self,
        prompts: PathLike,
        output: PathLike,
        *,
        reward: str | None = None,
        group: int | None = None,
        iterations: int | None = None,
        beta: float | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        progress: Progress = None,
        **options: Unpack[TuneOptions],
    ) -> TrainResult:
        """Group-relative policy optimisation against a reward (``ster tune grpo``)."""
        return self._job("tune grpo", _given({**locals(), **options}), progress)

    def evaluate_adapter(
        self,
        *,
        adapter: PathLike | None = None,
        examples: PathLike | None = None,
        pairs: PathLike | None = None,
        beta: float | None = None,
        max_sequence: int | None = None,
        batch_size: int | None = None,
        progress: Progress = None,
    ) -> EvaluateReport | PairEvaluateReport:
        """Loss on examples, or preference accuracy on pairs, with or without an adapter (``ster tune evaluate``)."""
        return self._job("tune evaluate", _given(locals()), progress)

    def merge(self, adapter: PathLike, output: PathLike, *, progress: Progress = None) -> MergeResult:
        """Fold a LoRA adapter into the weights and write the merged checkpoint (``ster tune merge``)."""
        return self._job("tune merge", _given(locals()), progress)

    # running

    def _job(self, name: str, fields: dict[str, Any], progress: Progress) -> Any:
        from ster.engine.protocol.jobs import build_job_request, request_class

        kind = request_class(name)
        fixed = {key: value for key, value in self._given.items() if key in kind.model_fields}
        request = _built(lambda: build_job_request(name, **fixed, **self._paths(fields)))
        return _run_job(name, request, _progress_of(progress, self), self._store)

    def _paths(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Fields as a request takes them: paths as text, an artifact object written to a file of its own."""
        from ster.engine.steering.artifact import SteeringArtifact

        found: dict[str, Any] = {}
        for key, value in fields.items():
            if isinstance(value, SteeringArtifact):
                value = self._written(value)
            found[key] = os.fspath(value) if isinstance(value, os.PathLike) else value
        return found

    def _written(self, artifact: SteeringArtifact) -> str:
        from ster.engine.steering.artifact import save_artifact

        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="ster-artifacts-"))
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        path = self._scratch / f"{artifact.trait_name or 'artifact'}-{id(artifact):x}.json"
        save_artifact(path, artifact)
        return str(path)


# jobs that need no model


def inspect(artifact: PathLike, *, progress: Progress = False) -> ArtifactSummary:
    """A steering artifact's summary, checked as every job checks it (``ster inspect``)."""
    return _plain_job("inspect", {"artifact": artifact}, progress)


def inspect_adapter(artifact: PathLike, *, progress: Progress = False) -> InspectResult:
    """A LoRA adapter's or a tune checkpoint's summary (``ster tune inspect``)."""
    return _plain_job("tune inspect", {"artifact": artifact}, progress)


def export_peft(
    adapter: PathLike, output: PathLike, *, base_model: str | None = None, progress: Progress = None
) -> ExportPeftResult:
    """Write a Ster adapter as a PEFT adapter directory (``ster tune export-peft``)."""
    return _plain_job("tune export-peft", _given(locals()), progress)


def import_model(gguf: PathLike, output: PathLike, *, progress: Progress = None) -> ImportResult:
    """A GGUF model converted into a checkpoint directory Ster and transformers load (``ster model import``)."""
    return _plain_job("model import", _given(locals()), progress)


def load_artifact(path: PathLike) -> SteeringArtifact:
    """A steering artifact read and checked (its directions, scores and calibration) as every job reads it."""
    from ster.engine.steering.artifact import load_artifact as load

    return _built(lambda: load(Path(path)))


# a transformers model the caller holds


@contextlib.contextmanager
def steer(
    model: Any,
    vector: Vector,
    *,
    strength: Strength | None = None,
    **options: Unpack[InterventionOptions],
) -> Iterator[None]:
    """Steer a transformers causal LM you hold (``AutoModelForCausalLM``) inside the block: every forward and
    ``generate`` of ``model`` is edited as ``ster generate`` edits Ster's own decoder (the same plan, the same
    logits), by hooks on its decoder layers that are removed when the block ends, whatever ends it.

    The artifact's width and layers are checked against ``model``; ``strength`` and the options are read as
    ``ster generate`` reads them, and left out they take the same defaults (the artifact's calibrated strength, or
    ``0.4x``; 1x of an imported vector)."""
    from ster.engine.steering import held

    artifact = vector if not isinstance(vector, str | os.PathLike) else load_artifact(vector)
    fields, parsed = _intervention(options, strength)
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    seen, edits = _built(lambda: held.prepared(model, artifact, parsed, fields, _context(events.put)))
    _drain(events, _sink(False))
    if edits is None:  # strength 0: the model as it is
        yield
        return
    with edits.applied(seen):
        yield


def read(
    model: Any,
    texts: Sequence[str] | Sequence[Sequence[int]],
    *,
    tokenizer: Any = None,
    layers: str | Sequence[int] | None = None,
    batch_size: int = 8,
) -> dict[int, Tensor]:
    """The residual stream after each of ``layers`` (``"all"``, ``"2..6"``, a list; every block by default) at
    each text's last token, from a transformers causal LM you hold: per layer an ``[len(texts), width]`` float32
    tensor, as Ster reads a pair's states. Texts are encoded by ``tokenizer`` as it encodes by default; lists of
    token ids are read as they are."""
    from ster.engine.steering import held

    return _built(lambda: held.read(model, tokenizer, texts, layers, batch_size, _context(lambda event: None)))


# the Python peers


def from_peer(
    vector: Any,
    model: Model | str,
    *,
    trait_name: str | None = None,
    revision: str | None = None,
    progress: Progress = False,
) -> SteeringArtifact:
    """A repeng ``ControlVector`` or a steering-vectors ``SteeringVector`` as a Ster artifact bound to ``model``
    (an opened :class:`Model` or a model's name): each vector's direction at unit length and its length kept, so
    strength ``1x`` adds the vector as it was (``ControlModel.set_control(vector, 1)``, ``vector.apply(model)``).
    Neither package is needed: the object is read by its attributes. Pass the artifact wherever a vector is taken,
    or write it with :meth:`Model.import_vector`, which takes the peer's object too."""
    from ster.engine.steering import peers
    from ster.engine.steering.vector_import import bound_artifact

    def build(ctx: JobContext) -> SteeringArtifact:
        found = peers.vectors_of(vector)
        name = peers.peer_name(vector)
        metadata = {"imported_from": name, **({"model_hint": found.model_hint} if found.model_hint else {})}
        target = model.name if isinstance(model, Model) else str(model)
        given_revision = revision if not isinstance(model, Model) else model._given.get("revision")
        trait = trait_name or type(vector).__name__
        return bound_artifact(ctx, found, name, f"a {name}", target, given_revision, trait, metadata)

    return _run_on_worker("vector import", build, progress, None)


def to_repeng(vector: Vector, *, strength: Strength | None = None, model_type: str | None = None) -> Any:
    """The artifact as a ``repeng.ControlVector`` that at coefficient 1 adds what ``ster generate`` adds at
    ``strength`` (left out: the strength ``generate`` takes when given none). ``model_type`` (``llama``) is what
    repeng records; left out, it is an imported vector's own hint, or read off the config.json of the artifact's
    model where that is at hand (a local directory, the Hub's cache: nothing is downloaded). Needs repeng installed."""
    from ster.engine.steering import peers

    artifact = vector if not isinstance(vector, str | os.PathLike) else load_artifact(vector)
    return _built(lambda: peers.to_repeng(artifact, _strength(strength), model_type))


def to_steering_vectors(vector: Vector, *, strength: Strength | None = None) -> Any:
    """The artifact as a ``steering_vectors.SteeringVector`` that at multiplier 1 adds what ``ster generate``
    adds at ``strength``. Needs steering-vectors installed."""
    from ster.engine.steering import peers

    artifact = vector if not isinstance(vector, str | os.PathLike) else load_artifact(vector)
    return _built(lambda: peers.to_steering_vectors(artifact, _strength(strength)))


# the machinery


_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The one thread every job of this process runs on (one OpenMP team: see ``ster.serve.app.ModelThread``)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ster-job")
        return _EXECUTOR


def _given(values: dict[str, Any], *leave: str) -> dict[str, Any]:
    """A method's arguments as request fields: those given (not None), less ``self``, ``progress``, ``options``."""
    skip = {"self", "progress", "options", *leave}
    return {key: value for key, value in values.items() if key not in skip and value is not None}


def _built(make: Callable[[], Any]) -> Any:
    """``make()``, with a refusal raised from here, as one sentence, not from deep inside."""
    try:
        return make()
    except SterError as exc:
        raise exc.with_traceback(None) from None


def _strength(value: Strength | None) -> Any:
    from ster.engine.protocol.requests import build_request
    from ster.engine.steering.requests import GenerateRequest

    if value is None:
        return None
    return _built(lambda: build_request(GenerateRequest, model="-", prompt="-", strength=value).strength)


def _intervention(options: Mapping[str, Any], strength: Strength | None) -> tuple[Any, Any]:
    """The intervention fields and the strength, checked in the commands' sentences."""
    from ster.engine.protocol.requests import build_request
    from ster.engine.steering.requests import InterventionFields

    extra = sorted(set(options) - set(InterventionFields.model_fields))
    if extra:
        raise TypeError(f"unexpected keyword argument {extra[0]!r}")
    fields = _built(lambda: build_request(InterventionFields, **options))
    return fields, _strength(strength)


def _context(put: Callable[[Any], None]) -> JobContext:
    from ster.engine.protocol.jobs import JobContext

    return JobContext(put)


def _progress_of(progress: Progress, model: Model | None) -> Progress:
    return model.progress if progress is None and model is not None else progress


def _plain_job(name: str, fields: dict[str, Any], progress: Progress) -> Any:
    from ster.engine.protocol.jobs import build_job_request

    given = {key: os.fspath(value) if isinstance(value, os.PathLike) else value for key, value in fields.items()}
    request = _built(lambda: build_job_request(name, **given))
    return _run_job(name, request, progress, None)


def _run_job(name: str, request: BaseModel, progress: Progress, models: ModelStore | None) -> Any:
    from ster.engine.protocol.jobs import execute

    return _run_on_worker(name, lambda ctx: execute(name, request, ctx), progress, models)


def _run_on_worker(name: str, work: Callable[[JobContext], Any], progress: Progress, models: Any) -> Any:
    """``work(ctx)`` on the job thread, its events shown here as they come; its value, or its error raised here.

    A KeyboardInterrupt sets the cancel flag and waits for the job to stop (a second one too), then is raised
    again: the job stops at its next step and, once cancelled, renames nothing into place."""
    from ster.engine.protocol.jobs import JobContext

    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    ctx = JobContext(events.put, threading.Event(), models)
    show = _sink(progress)
    future: Future[Any] = _executor().submit(work, ctx)
    interrupted = False
    try:
        while True:
            try:
                _drain(events, show, wait=0.1)
                if future.done():
                    _drain(events, show)
                    break
            except KeyboardInterrupt:
                interrupted = True
                ctx.cancel.set()
    finally:
        close = getattr(show, "close", None)
        if close is not None:
            close()
    error = future.exception()
    if interrupted:  # the job's own sentence: cancelled, nothing written (or the checkpoint a tune run left)
        raise KeyboardInterrupt(str(error) if isinstance(error, Cancelled) else "") from None
    if error is None:
        return future.result()
    if isinstance(error, SterError):
        raise error.with_traceback(None) from None
    raise SterError(f"internal error in {name}: {type(error).__name__}: {error}") from error


def _drain(events: queue.SimpleQueue[Any], show: Callable[[Any], None], wait: float | None = None) -> None:
    """Show every event waiting; with ``wait``, first wait that long for one."""
    if wait is not None:
        try:
            show(events.get(timeout=wait))
        except queue.Empty:
            return
    while True:
        try:
            show(events.get_nowait())
        except queue.Empty:
            return


def _sink(progress: Progress) -> Callable[[Any], None]:
    """What is done with each event: warnings raised, logs logged, and the caller's callable or a bar."""
    bar: _Bar | None = None
    if progress is True or (progress is None and _interactive()):
        bar = _Bar()
    call = progress if callable(progress) else None

    def show(event: Any) -> None:
        if event.type == "warning":
            warnings.warn(event.message, SterWarning, stacklevel=_callers_level())
        elif event.type == "log":
            logger.info(event.message)
        if call is not None:
            call(event)
        elif bar is not None:
            bar(event)

    show.close = bar.close if bar is not None else None  # type: ignore[attr-defined]
    return show


def _callers_level() -> int:
    """The ``stacklevel`` that makes a warning point at the first frame outside this module: the caller's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _interactive() -> bool:
    """Whether a person watches: stderr is a terminal, or the code runs in a Jupyter kernel that can show a live
    bar (rich draws one there with ipywidgets, and without it only warns that it cannot)."""
    if "ipykernel" in sys.modules:
        import importlib.util

        return importlib.util.find_spec("ipywidgets") is not None
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


class _Bar:
    """A transient progress bar: one line per countable stage, and the latest sentence of the others."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __call__(self, event: Any) -> None:
        if event.type != "progress":
            return
        if self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), transient=True
            )
            self._progress.start()
        if event.stage not in self._tasks:
            self._tasks[event.stage] = self._progress.add_task(event.message, total=event.total)
        self._progress.update(
            self._tasks[event.stage], completed=event.current or 0, total=event.total, description=event.message
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _saved(artifact: SteeringArtifact, output: Path, ctx: JobContext) -> ArtifactSummary:
    """The artifact written to ``output`` as ``ster vector import`` writes one, and its summary."""
    from ster.engine.protocol import inflight
    from ster.engine.protocol.files import check_output_file
    from ster.engine.protocol.kinds import ARTIFACT
    from ster.engine.steering.artifact import save_artifact, summarize

    check_output_file(output, ARTIFACT, ctx.log)
    with inflight.job_writes(ctx.cancel):
        save_artifact(output, artifact)
    ctx.log(f"imported {len(artifact.vectors)} directions into {output}; 1x adds each vector as it was")
    return summarize(artifact)
