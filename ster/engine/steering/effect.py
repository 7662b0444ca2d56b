"""Whether a sweep's effect can be told apart from zero, and which strengths to suggest.

A sweep generates every prompt unsteered and at each strength, and re-reads each text
with the unsteered model (see ``sweep``). The **effect** of a strength on one prompt is
that prompt's steered reading minus its own unsteered reading: a paired difference, so
what the prompts have in common cancels. It is exactly 0 when steering left the text's
tokens unchanged. The row's effect is the mean over prompts, in the units of the
projection onto the unit direction (the residual stream's own units at the artifact's
layers); positive means the text reads closer to the pair set's positive side (the
trait), negative closer to its negative side.

The **noise** of that mean is its standard error over prompts, sd / √n: how much the
mean would move with other prompts of the same kind. A text that changes for reasons
unrelated to the trait moves its reading up or down by chance, so with few prompts a
mean of a few such changes is large without meaning anything; the standard error
grows with that disagreement. An effect is **distinguishable** when it lies outside
the two-sided 95% interval of Student's t for n − 1 degrees of freedom: |effect| >
t · noise. One changed text out of n never passes (its mean is exactly one standard
error from 0), and one prompt has no noise to judge against, so it never passes either.

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
"""Student's t at 0.975 for 1..30 degrees of freedom."""


def t_quantile(degrees: int) -> float:
    """Student's t at 0.975 (two-sided 95%); past 30 degrees 1.96 + 2.5/df is within 0.002 of it."""
    if degrees < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    return _T_975[degrees - 1] if degrees <= len(_T_975) else 1.96 + 2.5 / degrees


@dataclass(frozen=True)
class Effect:
    """One strength's effect over prompts, and whether it can be told apart from 0."""

    mean: float | None
    """Mean of the per-prompt effects (null when no prompt has a reading at both strengths)."""
    noise: float | None
    """Standard error of that mean (null with fewer than two per-prompt effects)."""
    threshold: float | None
    """``t · noise``: the |effect| it must exceed."""
    distinguishable: bool


def paired(
    steered: Sequence[float | None], baseline: Sequence[float | None], unchanged: Sequence[bool]
) -> list[float | None]:
    """Per prompt, steered reading minus baseline reading; exactly 0 where the text's tokens did not change
    (so read-out rounding cannot pass for an effect), null where either text is empty."""
    return [
        0.0 if same else None if s is None or b is None else s - b for s, b, same in zip(steered, baseline, unchanged)
    ]


def judge(effects: Sequence[float | None]) -> Effect:
    """The mean effect, its standard error, and whether it lies outside the 95% interval around 0."""
    values = [e for e in effects if e is not None]
    if not values:
        return Effect(mean=None, noise=None, threshold=None, distinguishable=False)
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return Effect(mean=mean, noise=None, threshold=None, distinguishable=False)
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    noise = math.sqrt(variance / len(values))
    threshold = t_quantile(len(values) - 1) * noise
    return Effect(mean=mean, noise=noise, threshold=threshold, distinguishable=abs(mean) > threshold)


@dataclass(frozen=True)
class Judged:
    """What ``suggest`` and ``stillness`` need of one sweep row."""

    strength: float
    label: str
    effect: float | None
    threshold: float | None
    distinguishable: bool
    fluent: bool


def suggest(rows: Sequence[Judged], sign: int) -> float | None:
    """Walking out from 0 on one side, the largest strength before the first that is not fluent whose effect
    is distinguishable from 0 and on the strength's own side; None when there is none."""
    chosen = None
    for row in sorted((r for r in rows if r.strength * sign > 0), key=lambda r: abs(r.strength)):
        if not row.fluent:
            break
        if row.distinguishable and row.effect is not None and row.effect * sign > 0:
            chosen = row.strength
    return chosen


def stillness(rows: Sequence[Judged], prompts: int) -> str | None:
    """One sentence when no steered strength moved the text distinguishably from 0, else None."""
    steered = [r for r in rows if r.strength != 0]
    if any(r.distinguishable for r in steered):
        return None
    if prompts < 2:
        return (
            "no strength can be told apart from 0 on one prompt, which gives the effect no noise to be "
            "judged against, so none is suggested; sweep two or more prompts (five or more for a useful test)"
        )
    measured = [r for r in steered if r.effect is not None]
    if not measured:
        return "no strength moved the text: every steered text is empty"
    top = max(measured, key=lambda r: abs(r.effect or 0.0))
    if not top.effect:
        return (
            f"no strength moved the text: at every strength all {prompts} texts are the same as unsteered; "
            f"try larger strengths"
        )
    return (
        f"no strength moved the text distinguishably from its noise: the largest effect, {top.effect:+.3g} at "
        f"{top.label}, is within {top.threshold or 0.0:.3g} of 0 over {prompts} prompts; try larger strengths, "
        f"more prompts, or another layer"
    )
