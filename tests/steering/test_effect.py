"""Whether a sweep's effect can be told apart from zero: paired effects, their noise, the suggestion."""

from __future__ import annotations

import math

import pytest

from ster.engine.steering.effect import Judged, judge, paired, stillness, suggest, t_quantile


def test_student_t_matches_its_table_and_tends_to_the_normal() -> None:
    assert t_quantile(5) == 2.571 and t_quantile(1) == 12.706
    assert t_quantile(40) == pytest.approx(2.021, abs=0.002) and t_quantile(120) == pytest.approx(1.980, abs=0.002)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_an_unchanged_text_has_an_effect_of_exactly_zero() -> None:
    assert paired([1.5, 2.0, None], [1.5 + 1e-7, 1.0, 3.0], [True, False, False]) == [0.0, 1.0, None]


@pytest.mark.parametrize("n", [3, 4, 6, 24])
def test_one_changed_text_is_never_distinguishable(n: int) -> None:
    """Its mean is exactly one standard error from 0, and Student's t is always above 1."""
    verdict = judge([5.0] + [0.0] * (n - 1))
    assert verdict.mean == pytest.approx(5.0 / n) and verdict.noise == pytest.approx(5.0 / n)
    assert not verdict.distinguishable


def test_a_consistent_effect_is_distinguishable_and_a_scattered_one_is_not() -> None:
    consistent = judge([2.0, 2.5, 1.5, 2.2, 1.8, 2.0])
    assert consistent.distinguishable and consistent.threshold == pytest.approx(2.571 * consistent.noise)
    scattered = judge([4.0, -3.0, 2.5, -1.0, 0.5, -2.0])
    assert not scattered.distinguishable and abs(scattered.mean) < scattered.threshold
    noise = math.sqrt(sum((x - 1 / 6) ** 2 for x in (4.0, -3.0, 2.5, -1.0, 0.5, -2.0)) / 5 / 6)
    assert scattered.noise == pytest.approx(noise)


def test_nothing_to_judge_against() -> None:
    assert judge([0.0] * 6).distinguishable is False  # nothing moved: 0 is not beyond a threshold of 0
    single = judge([3.0])
    assert single.mean == 3.0 and single.noise is None and not single.distinguishable
    assert judge([None, None]).mean is None


def row(strength: float, effect: float | None, distinguishable: bool = True, fluent: bool = True) -> Judged:
    return Judged(
        strength=strength,
        label=f"{strength:+g}x",
        effect=effect,
        threshold=1.0,
        distinguishable=distinguishable,
        fluent=fluent,
    )


def test_the_suggestion_is_the_largest_fluent_distinguishable_strength_on_its_own_side() -> None:
    rows = [
        row(-0.8, -3.0, fluent=False),
        row(-0.4, +2.0),
        row(-0.2, -1.5),
        row(0, 0.0, False),
        row(0.2, 0.5, distinguishable=False),
        row(0.4, 2.0),
        row(0.6, 1.0, distinguishable=False),
        row(0.8, 9.0, fluent=False),
        row(1.2, 9.0),
    ]
    assert suggest(rows, 1) == 0.4  # 0.6 is noise, and the walk stops at 0.8, which breaks the text
    assert suggest(rows, -1) == -0.2  # -0.4 moved the text the wrong way


def test_when_nothing_moves_one_sentence_says_so() -> None:
    assert stillness([row(0, 0.0, False), row(0.4, 2.0)], 6) is None
    sentence = stillness([row(-0.4, 0.3, False), row(0, 0.0, False), row(0.4, -0.9, False)], 6)
    assert sentence == (
        "no strength moved the text distinguishably from its noise: the largest effect, -0.9 at "
        "+0.4x, is within 1 of 0 over 6 prompts; try larger strengths, more prompts, or another layer"
    )
    assert "all 6 texts are the same as unsteered" in stillness([row(0, 0.0, False), row(0.4, 0.0, False)], 6)
    assert "on one prompt" in stillness([row(0, 0.0, False), row(0.4, 2.0, False)], 1)
