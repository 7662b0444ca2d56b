"""The ``steering`` field of an OpenAI-style request: what each row of a served batch does to the stream.

A spec is a list of interventions (one object, or a bare vector name or path, is a list of one). Each
names a steering artifact (a path, or a name registered with ``POST /v1/steering``) and says how it
acts: the mode (``add``, ``ablate``, ``clamp``), the layers, the strength (``scale``), where in the text
(the prompt, the generated tokens or both, narrowed to prompt positions or a window of generated
tokens), and optionally a **condition** decided on the prompt, in the manner of conditional activation
steering (CAST): the intervention applies only when the prompt's state at a layer, measured along a
condition direction, passes a threshold. Field names follow EasySteer's where it has the same idea
(``scale``, ``target_layers``, ``prefill_trigger_positions``, ``generate_first_k_tokens``,
``generate_after_k_tokens``).

Every field is checked here, before a model is touched; an unknown field is refused by name, because a
misspelt one would change the text silently. Nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from ster.engine.steering.intervention import Mode

Comparator = Literal[">", ">=", "<", "<="]
Measure = Literal["projection", "cosine"]
ApplyTo = Literal["both", "prompt", "generation"]
MAX_INTERVENTIONS = 16
"""The most interventions one request may stack."""


class Condition(BaseModel):
    """When an intervention applies: the prompt's state at ``layer``, averaged over the prompt's tokens (or its
    last token), measured along ``vector``'s direction at that layer, compared with ``threshold``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    vector: str = Field(description="A steering artifact (path or registered name) whose direction is the condition.")
    layer: int | None = Field(
        default=None, ge=0, description="The block whose output is read (default: the artifact's first layer)."
    )
    threshold: float = Field(description="What the measure is compared with.")
    comparator: Comparator = Field(default=">", description="How: the measure ``comparator`` the threshold.")
    measure: Measure = Field(
        default="cosine",
        description="``cosine``: the cosine of the state with the direction (scale-free); ``projection``: the "
        "state's component along the unit direction, in the residual stream's units.",
    )
    aggregate: Literal["mean", "last"] = Field(
        default="mean", description="The prompt's state: the mean over its tokens (CAST's), or its last token's."
    )

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    def passes(self, value: float) -> bool:
        return {
            ">": value > self.threshold,
            ">=": value >= self.threshold,
            "<": value < self.threshold,
            "<=": value <= self.threshold,
        }[self.comparator]


class Intervention(BaseModel):
    """One artifact's direction applied to a row: added, ablated or clamped, where and how strongly."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    vector: str = Field(description="A steering artifact: a path (under the server's --root) or a registered name.")
    mode: Mode = Field(
        default="add", description="``add`` steers, ``ablate`` removes the direction, ``clamp`` sets it."
    )
    scale: float | str | None = Field(
        default=None,
        validation_alias=AliasChoices("scale", "strength"),
        description="The strength: a number in the residual stream's units, a multiple of each layer's activation "
        'norm such as ``"0.4x"``, or ``"calibrated"`` (the artifact\'s calibrated strength). Default: as '
        "``ster generate`` (the calibrated strength where the artifact has one; 1 for ``ablate``).",
    )
    target_layers: list[int] | str | None = Field(
        default=None,
        validation_alias=AliasChoices("target_layers", "layers"),
        description='The blocks it acts at: a list, or ``"all"``, ``"2,5"``, ``"2..6"`` (default: the mode\'s: '
        "the artifact's layers for ``add``, every block and the embedding for ``ablate`` and ``clamp``).",
    )
    direction_layer: int | None = Field(default=None, ge=0, description="Ablate or clamp with this layer's direction.")
    peak_weight: float = 1.0
    peak_layer: float | None = None
    min_weight: float | None = None
    falloff: float | None = None
    apply_to: ApplyTo = Field(default="both", description="The prompt's tokens, the generated ones, or both.")
    prefill_trigger_positions: list[int] | None = Field(
        default=None,
        description="Only these prompt positions (negative counts from the end: -1 is the last prompt token).",
    )
    generate_first_k_tokens: int | None = Field(
        default=None, ge=0, description="Only while the first k generated tokens are read back in."
    )
    generate_after_k_tokens: int | None = Field(
        default=None, ge=0, description="Only from the k-th generated token on (0-based)."
    )
    condition: Condition | None = None

    @field_validator("vector")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a steering artifact (a path or a registered name)")
        return value

    @field_validator("scale", mode="before")
    @classmethod
    def _scale(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError('must be a number, a multiple such as "0.4x", or "calibrated"')
        if isinstance(value, int | float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        if isinstance(value, str) and value != "calibrated":
            from ster.engine.steering.strength import Strength

            try:
                Strength.model_validate(value)
            except ValueError:
                raise ValueError(
                    f'"{value[:40]}" is not a number, a multiple such as "0.4x", or "calibrated"'
                ) from None
        return value

    @field_validator("target_layers", mode="before")
    @classmethod
    def _layers(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
                raise ValueError(
                    'must be a non-empty list of block indices (0 or more), or a layer spec such as "2..6"'
                )
            return value
        if isinstance(value, str):
            from ster.engine.steering.layers import LayerSpec

            LayerSpec.parse(value)
        return value

    @model_validator(mode="after")
    def _fits(self) -> Intervention:
        from ster.engine.steering.requests import InterventionFields

        InterventionFields.model_validate(self.fields())  # the profile's and the mode's rules, in their sentences
        if self.apply_to == "prompt" and (
            self.generate_first_k_tokens is not None or self.generate_after_k_tokens is not None
        ):
            raise ValueError("generate_first_k_tokens and generate_after_k_tokens need apply_to generation or both")
        if self.apply_to == "generation" and self.prefill_trigger_positions is not None:
            raise ValueError("prefill_trigger_positions needs apply_to prompt or both")
        return self

    def fields(self) -> dict[str, Any]:
        """The fields :class:`~ster.engine.steering.requests.InterventionFields` shares with ``ster generate``."""
        layers = self.target_layers
        return {
            "mode": self.mode,
            "layers": ",".join(map(str, layers)) if isinstance(layers, list) else layers,
            "direction_layer": self.direction_layer,
            "peak_weight": self.peak_weight,
            "peak_layer": self.peak_layer,
            "min_weight": self.min_weight,
            "falloff": self.falloff,
        }

    def names(self) -> list[str]:
        """Every artifact it names: its own and its condition's."""
        return [self.vector, *([self.condition.vector] if self.condition else [])]


class SteeringSpec(BaseModel):
    """A request's ``steering`` field: interventions applied together to each of its rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    interventions: list[Intervention] = Field(max_length=MAX_INTERVENTIONS)

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, value: Any) -> Any:
        """A bare name or path, one object, or a list, each short for ``{"interventions": [...]}``."""
        if isinstance(value, str):
            return {"interventions": [{"vector": value}]}
        if isinstance(value, list):
            return {"interventions": value}
        if isinstance(value, dict) and "interventions" not in value:
            return {"interventions": [value]}
        return value


def parse_spec(value: Any) -> SteeringSpec | None:
    """The spec of a request's ``steering`` field (None or an empty list: unsteered); raises pydantic's
    ValidationError, which :func:`error_sentence` turns into one sentence."""
    if value is None or value == []:
        return None
    return SteeringSpec.model_validate(value)


def error_sentence(exc: Any, field: str) -> tuple[str, str]:
    """(sentence, param) for the first error of a pydantic ValidationError under the body's ``field``."""
    first = exc.errors()[0]
    location = [field, *(str(part) for part in first["loc"] if part not in ("interventions",))]
    if first["loc"][:1] == ("interventions",) and len(first["loc"]) > 1:
        location = [field, f"[{first['loc'][1]}]", *(str(part) for part in first["loc"][2:])]
    param = ".".join(location).replace(".[", "[")
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "is not a field of a steering intervention; see the schema at /docs"
    elif first["type"] == "missing":
        message = "is required"
    return f"{param} {message}", param
