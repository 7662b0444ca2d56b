"""Requests of the tune jobs: sft, dpo, reward, grpo, evaluate, merge, inspect, export-peft.

Every number a run takes is checked here, before anything loads, with the contract's
sentences: the subject names the objective (``direct preference optimization requires
at least one epoch``) and the unit what a batch counts (example, pair).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

from pydantic import field_validator, model_validator

from ster.engine.model.adapters.artifact import check_spec, parse_targets, sidecar_path
from ster.engine.model.requests import Device, ModelRequest
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import field_name, flag
from ster.engine.protocol.paths import same_file
from ster.engine.protocol.requests import Request, not_negative, nucleus, seed
from ster.engine.steering.layers import LayerSpec


def min_sequence_sentence() -> str:
    """The contract's refusal of a sequence limit under two tokens."""
    return f"{field_name('max_sequence')} must be at least two tokens, so that one token can predict another"


class AdapterSpecRequest(ModelRequest):
    """Where the adapter goes and how large it is."""

    rank: int = 8
    alpha: float = 16.0
    targets: str = "query,value"
    """Projections that carry an adapter: query, key, value, output, gate, up, down, or q_proj and the rest."""
    layers: str = "all"

    @model_validator(mode="after")
    def _spec(self) -> AdapterSpecRequest:
        try:
            check_spec(self.rank, self.alpha)
            parse_targets(self.targets)
            LayerSpec.parse(self.layers)
        except Refusal as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def target_names(self) -> list[str]:
        return parse_targets(self.targets)


class TuneRequest(AdapterSpecRequest):
    """What every training objective shares: the schedule, the batch, the output, the checkpoints."""

    subject: ClassVar[str] = "training"
    unit: ClassVar[str] = "example"
    output: Path
    """The adapter's safetensors file; its sidecar is the same path with ``.json``."""
    epochs: int = 1
    learning_rate: float = 1e-4
    accumulation: int = 8
    warmup_steps: int = 0
    max_sequence: int = 512
    batch_size: int = 1
    seed: int = 42
    checkpoint_every: int = 0
    """Write a resumable checkpoint every this many optimizer steps (0: only when interrupted)."""
    resume: bool = False
    """Continue from the checkpoint beside ``output`` instead of starting over."""

    _seed = field_validator("seed")(lambda cls, v: seed(v))
    _warmup = field_validator("warmup_steps")(lambda cls, v: not_negative(v, "warmup_steps"))
    _every = field_validator("checkpoint_every")(lambda cls, v: not_negative(v, "checkpoint_every"))

    @model_validator(mode="after")
    def _schedule(self) -> TuneRequest:
        if self.epochs < 1:
            raise ValueError(f"{self.subject} requires at least one epoch")
        if self.accumulation < 1:
            raise ValueError(f"{self.subject} requires an accumulation of at least one {self.unit}")
        if self.batch_size < 1:
            raise ValueError(f"{self.subject} requires a batch of at least one {self.unit}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"{self.subject} requires a finite learning rate above zero")
        if self.max_sequence < 2:
            raise ValueError(min_sequence_sentence())
        _check_sidecar_apart(self)
        return self

    @property
    def passes(self) -> int:
        """Passes over the data: epochs (GRPO's iterations)."""
        return self.epochs


def _check_sidecar_apart(request: TuneRequest) -> None:
    """The sidecar is written too: it must not be the adapter itself, nor any input."""
    output = request.output
    side = sidecar_path(output)
    if side == output:
        raise ValueError(
            f"{flag('output')} {output} ends in .json, which is where its sidecar goes; give a name such as "
            f"{output.with_suffix('.safetensors')}"
        )
    for name, value in request:
        if isinstance(value, Path) and name != "output" and same_file(side, value):
            raise ValueError(
                f"the sidecar of {flag('output')} {output} would be {side}, the same file as {flag(name)} "
                f"{value}; give {flag('output')} another name"
            )


class SftRequest(TuneRequest):
    """``ster tune sft``: completion-only cross-entropy on prompt/completion examples."""

    subject: ClassVar[str] = "supervised fine-tuning"
    examples: Path
    """``{"examples": [{"prompt", "completion"}]}``, or JSON Lines with prompt/completion or messages."""


class PreferenceRequest(TuneRequest):
    """The objectives that read preference pairs: the positive side chosen, the negative rejected."""

    unit: ClassVar[str] = "pair"
    pairs: Path | None = None
    """A pair set (the workspace's active set when omitted), or JSON Lines with prompt/chosen/rejected."""


class DpoRequest(PreferenceRequest):
    """``ster tune dpo``: direct preference optimization (or IPO) against the frozen base."""

    subject: ClassVar[str] = "direct preference optimization"
    beta: float = 0.1
    loss: str = "dpo"

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        if value not in ("dpo", "ipo"):
            raise ValueError(f'unknown preference loss "{value}"; expected dpo or ipo')
        return value

    @field_validator("beta")
    @classmethod
    def _beta(cls, value: float) -> float:
        if not (math.isfinite(value) and value > 0):
            raise ValueError("direct preference optimization requires a finite beta above zero")
        return value


class RewardRequest(PreferenceRequest):
    """``ster tune reward``: a Bradley–Terry reward model, a scalar head on the adapted model."""

    subject: ClassVar[str] = "reward modeling"


class GrpoRequest(TuneRequest):
    """``ster tune grpo``: group-relative policy optimization on completions the policy samples itself.

    An iteration is one pass over the prompts (the other objectives' epoch); one optimizer step takes
    ``accumulation`` prompts, and there is no batch size: a prompt's group is decoded as one batch.
    """

    subject: ClassVar[str] = "group-relative policy optimization"
    unit: ClassVar[str] = "prompt"
    prompts: Path
    """``{"prompts": ["..."]}``, the shape extract reads."""
    reward: str = "length"
    """``length`` (the completion's token count) or a reward model written by ``tune reward``."""
    group: int = 4
    iterations: int = 1
    beta: float = 0.04
    accumulation: int = 1
    max_new_tokens: int = 64
    temperature: float = 0.9
    top_p: float | None = 0.95

    _top_p = field_validator("top_p")(lambda cls, v: nucleus(v))

    @model_validator(mode="after")
    def _grpo(self) -> GrpoRequest:
        if not self.reward.strip():
            raise ValueError(f"{self.subject} requires a reward source; pass length or a reward artifact")
        if self.group < 2:
            raise ValueError(
                f"{self.subject} requires a group of at least two completions, because the group is the baseline"
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(
                f"{self.subject} requires a temperature above zero; argmax sampling would draw one "
                "identical completion per group"
            )
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"{self.subject} requires a finite beta of zero or more")
        if self.max_new_tokens < 1:
            raise ValueError(f"{field_name('max_new_tokens')} must be greater than zero")
        if self.iterations < 1:
            raise ValueError(f"{self.subject} requires at least one iteration")
        if self.batch_size != 1:
            raise ValueError(f"{self.subject} takes no batch size: each prompt's group is decoded as one batch")
        source = self.reward_path
        if source is not None and same_file(source, self.output):
            raise ValueError(
                f"{flag('output')} {self.output} is the reward model given as {flag('reward')}; give {flag('output')} another name"
            )
        return self

    @property
    def reward_path(self) -> Path | None:
        """The reward model's path, or None for the ``length`` keyword."""
        return None if self.reward.strip() == "length" else Path(self.reward)

    @property
    def passes(self) -> int:
        return self.iterations


class TuneEvaluateRequest(ModelRequest):
    """``ster tune evaluate``: held-out numbers of a checkpoint or an adapter; writes nothing.

    On ``examples``: completion-token loss and perplexity, with or without an adapter. On
    ``pairs`` (beyond the original): with a generation adapter, the DPO implicit-reward accuracy
    against the bare checkpoint as the reference; with a reward model, its ranking accuracy.
    """

    examples: Path | None = None
    """Held-out supervised examples (exactly one of ``examples`` and ``pairs``)."""
    pairs: Path | None = None
    """Held-out preference pairs, the positive side chosen; needs ``adapter``."""
    adapter: Path | None = None
    """A generation adapter (a reward model too, with ``pairs``); None scores the bare checkpoint on examples."""
    beta: float = 0.1
    """With pairs and a generation adapter: the implicit reward is beta times the log-ratio to the reference."""
    max_sequence: int = 512
    batch_size: int = 1

    @model_validator(mode="after")
    def _numbers(self) -> TuneEvaluateRequest:
        if (self.examples is None) == (self.pairs is None):
            raise ValueError(
                f"tune evaluate takes {flag('examples')} (completion loss) or {flag('pairs')} (preference accuracy), exactly one of them"
            )
        if self.pairs is not None and self.adapter is None:
            raise ValueError(
                f"tune evaluate {flag('pairs')} measures an adapter: give {flag('adapter')}, a generation adapter "
                "(implicit-reward accuracy) or a reward model (ranking accuracy)"
            )
        if self.max_sequence < 2:
            raise ValueError(min_sequence_sentence())
        if self.batch_size < 1:
            raise ValueError(f"evaluation requires a batch of at least one {self.unit}")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError("evaluation requires a finite beta above zero")
        return self

    @property
    def unit(self) -> str:
        return "pair" if self.pairs is not None else "example"


class MergeRequest(Request):
    """``ster tune merge``: the adapter folded into a copy of the checkpoint's weights."""

    directory_outputs: ClassVar[tuple[str, ...]] = ("output",)
    model: str
    revision: str | None = None
    device: Device = "cpu"
    adapter: Path
    output: Path
    """A new (or empty) directory."""


class TuneInspectRequest(Request):
    """``ster tune inspect``: an adapter's sidecar with every tensor's name and shape; no model."""

    artifact: Path


class ExportPeftRequest(Request):
    """``ster tune export-peft``: an adapter as a directory PEFT's ``from_pretrained`` loads."""

    directory_outputs: ClassVar[tuple[str, ...]] = ("output",)
    adapter: Path
    output: Path
    """A new (or empty) directory."""
    base_model: str | None = None
    """What the PEFT config names as its base model (default: the sidecar's model)."""
