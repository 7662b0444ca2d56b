"""A steering strength: in the residual stream's own units, or relative to each layer's activation spread.

Residual norms differ by orders of magnitude between models and between the layers of
one model (about 30 to 900 across SmolLM2-135M's 30 layers), so an absolute strength
that moves one model's text does nothing to another's. A strength written with an
``x`` suffix — ``0.4x`` — is a multiple of the layer's ``activation_norm`` (the mean
norm of the states the direction was fitted on): at each steered layer the direction
is scaled by ``0.4 × activation_norm`` of that layer, or by 0.4 × its ``activation_spread`` (the RMS spread of
the states about their mean over every position of the fitting texts) where the artifact's ``strength_unit``
is ``spread``. A bare number — ``3`` — is the
absolute scale, the same at every layer. One spelling serves the CLI, the TUI, the
sweep and JSON requests (a number, or a string such as ``"0.4x"`` or ``"-3"``).

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ster.engine.protocol.errors import Refusal

Unit = Literal["absolute", "relative"]

DEFAULT_STRENGTH = "0.4x"
"""The strength a front end offers first, for an artifact without a calibrated one: 0.4 of each layer's
activation spread. Measured on SmolLM2-135M-Instruct at the layer ``optimize`` picks (21; spread 0.72 of the
norm): every held-out answer changes, the effect is distinguishable from 0, the text stays fluent and the mean
KL from the unsteered model is 0.20. On Gemma 3 270M (layer 7; spread 0.24 of the norm, which massive
activations inflate) the text stays readable and held-out behaviour moves strongly, at a KL of 0.51: a
default cannot fit every model, so ``calibrate`` chooses per model and the sweep reports each strength's KL.
0.4 of the *norm*, the unit before the spread, breaks Gemma's text."""
DEFAULT_SWEEP = "-0.8x,-0.4x,-0.2x,0.2x,0.4x,0.8x"
"""The strengths a sweep walks when none are given: half, once and twice the default strength, each way —
where steering starts, where it works, and where it costs more than the KL budget on SmolLM2 — relative, so the
sweep scales with the artifact's activation spread, and a factor of two either side of the default for a model
that differs."""

DEFAULT_KL_BUDGET = 0.25
"""The mean KL (nats per token over the unsteered model's own continuation of a neutral prompt) a calibrated
strength may cost by default: about what the default strength, 0.4x of the spread, costs at the layer
``optimize`` picks on SmolLM2-135M-Instruct (0.20 at layer 21), where the text is steered and stays fluent; at
0.1 SmolLM2's answers barely change, and past 0.5 (heretic's warning) the text drifts. On Gemma 3 270M, where
0.4x costs 0.43, the strengths calibrated to 0.25 keep the text readable. See docs/steering.md's calibration
tables."""
DEFAULT_TRIALS = 40
"""Candidates ``calibrate`` measures by default: every single layer of a 30-layer model with caa, then the other
methods at the best layers, then layer ranges around the best."""

SPELLING = "a number such as 3 or a multiple of each layer's activation spread such as 0.4x"

EXCESSIVE = 10.0
"""A push past this many times a layer's activation norm drowns the residual stream: the text it gives is
noise, not the trait (SmolLM2-135M's text already breaks at 0.8x), so it is warned about."""


class Strength(BaseModel):
    """How hard to push along a direction: ``value`` in its ``unit``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    value: float
    unit: Unit = "absolute"

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, raw: Any) -> Any:
        """Accept a number, the text spelling (``"3"``, ``"-0.4x"``), or the model's own fields."""
        if isinstance(raw, bool):
            raise ValueError(f"must be {SPELLING}; got {raw}")
        if isinstance(raw, int | float):
            raw = {"value": raw}
        elif isinstance(raw, str):
            raw = _from_text(raw)
        if isinstance(raw, dict) and isinstance(raw.get("value"), int | float) and not math.isfinite(raw["value"]):
            raise ValueError(f"must be a finite number; got {raw['value']}")
        return raw

    @property
    def relative(self) -> bool:
        return self.unit == "relative"

    def __str__(self) -> str:
        return f"{self.value:g}x" if self.relative else f"{self.value:g}"

    def signed(self) -> str:
        """The text with its sign always shown, as sweep streams and tables label a strength."""
        return f"{self.value:+g}x" if self.relative else f"{self.value:+g}"

    def per_layer(self, units: dict[int, float | None], unit: str = "activation_norm") -> dict[int, float]:
        """The absolute scale at each layer, given what ``1x`` is there (``unit``, None: not recorded)."""
        if not self.relative:
            return {layer: self.value for layer in units}
        missing = sorted(layer for layer, scale in units.items() if not scale)
        if missing and self.value != 0:
            raise Refusal(
                f"strength {self} is relative to the layer's {unit.replace('_', ' ')}, but the artifact "
                f"records no {unit} for layer {missing[0]}; give an absolute strength instead"
            )
        return {layer: self.value * (scale or 0.0) for layer, scale in units.items()}

    def relative_per_layer(self, norms: dict[int, float | None]) -> dict[int, float]:
        """Per layer that records a norm, the scale over that norm: how large the push is against the stream."""
        absolute = self.per_layer(norms)
        return {layer: absolute[layer] / norm for layer, norm in norms.items() if norm}


def excess_warning(strength: Strength, relative: dict[int, float], norms: dict[int, float | None]) -> str | None:
    """One sentence when the push at some layer exceeds ``EXCESSIVE`` times its activation norm, else None.

    ``relative`` is the strength over each layer's norm (layers without a recorded norm cannot be judged)."""
    over = {layer: ratio for layer, ratio in relative.items() if abs(ratio) > EXCESSIVE}
    if not over:
        return None
    layer = max(over, key=lambda k: abs(over[k]))
    return (
        f"strength {strength} is {abs(over[layer]):.3g} times layer {layer}'s activation norm "
        f"({norms[layer]:.4g}); past {EXCESSIVE:g} times the norm the direction drowns out the residual "
        f"stream and the text is noise rather than steered"
    )


def _from_text(text: str) -> dict[str, Any]:
    spelled = text.strip().lower()
    relative = spelled.endswith("x")
    number = spelled[:-1].strip() if relative else spelled
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f'must be {SPELLING}; got "{text}"') from None
    return {"value": value, "unit": "relative" if relative else "absolute"}


def parse_strengths(raw: Any) -> list[Strength]:
    """A sweep's strengths from a comma list (``"-0.8x,-0.4x,0.4x"``) or a list of single strengths."""
    items: Iterable[Any] = raw.split(",") if isinstance(raw, str) else raw
    return [Strength.model_validate(item.strip() if isinstance(item, str) else item) for item in items]
