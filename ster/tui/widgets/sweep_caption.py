"""What the Generate pane says under a sweep: what was swept, what it suggests or why nothing, what effect means.

The engine suggests a strength only when its effect can be told apart from the noise of
that effect over prompts (see ``ster.engine.steering.effect``). A sweep of one prompt has
no noise to judge against, so it never suggests anything; the caption says so in the
app's words and where to name more prompts. When several prompts were swept and nothing
moved, the caption carries the engine's own sentence (its largest effect and the band it
stayed within), rebuilt from the result, in place of the warning the job sent.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ster.tui.widgets.generate_parts import mode_words, shown_value
from ster.tui.widgets.sweep_table import AGAINST, TOWARD, verdict
from ster.tui.words import in_our_words

ONE_PROMPT = (
    "nothing suggested: one prompt gives an effect no noise to be told apart from; name a prompt set "
    "under prompts (a file, or ster:prompts) to sweep several."
)
NONE_ON_ITS_SIDE = (
    "nothing suggested: what moved beyond its noise moved against the push, or came after a strength "
    "whose text was no longer fluent."
)


def prompt_count(data: dict[str, Any]) -> int:
    return len(data["rows"][0]["outputs"]) if data["rows"] else 0


def source_words(count: int, source: str | None) -> str:
    """Which prompts were swept: ``the prompt above`` or ``4 prompts of ster:prompts``."""
    if source is None:
        return "the prompt above"
    return f"{count} prompt{'s' if count != 1 else ''} of {source}"


def nothing_moved(data: dict[str, Any]) -> str | None:
    """The engine's sentence for a sweep in which no strength moved the text beyond its noise, else None."""
    if data.get("moved", True):
        return None
    from ster.engine.steering.effect import Judged, stillness
    from ster.engine.steering.strength import Strength

    verdicts = [
        Judged(
            strength=row["strength"],
            label=Strength(value=row["strength"], unit=data["strength_unit"]).signed(),
            effect=row["effect"],
            threshold=row["threshold"],
            distinguishable=row["distinguishable"],
            fluent=row["fluent"],
        )
        for row in data["rows"]
    ]
    return stillness(verdicts, prompt_count(data))


def sweep_caption(
    data: dict[str, Any], artifact: str, source: str | None, adapter: str | None = None, mode: str = "add"
) -> Text:
    """What was swept (in ``mode``, on the model, through ``adapter`` when one was attached) and on which prompts,
    what it suggests (or why nothing), and what effect means: its unit, which sign is the trait's, and the marks
    beside it."""
    count = prompt_count(data)
    model = data["model"] if adapter is None else f"{data['model']} through the adapter {adapter}"
    swept = f"swept {artifact}{mode_words(mode)} on {model}, {source_words(count, source)}: "
    caption = Text.assemble((swept, "bold"))
    suggested, unit = data["suggested"], data["strength_unit"]
    picks = [
        shown_value(suggested[sign], unit, mode) for sign in ("positive", "negative") if suggested[sign] is not None
    ]
    still = nothing_moved(data)
    if picks:
        caption.append_text(Text.assemble("suggested ", (", ".join(picks), "bold green"), ". "))
    elif count < 2:
        caption.append(ONE_PROMPT + " ", style="yellow")
    elif still:
        caption.append(f"nothing suggested: {in_our_words(still)}. ", style="yellow")
    else:
        caption.append(NONE_ON_ITS_SIDE + " ", style="yellow")
    caption.append(
        f"effect: how far the text moved along the direction, read back unsteered, minus the "
        f"baseline's (residual-stream units): + toward {data['trait_name'] or 'the trait'}, − away"
    )
    if count > 1:
        caption.append(f"; ± its noise band (95%), {TOWARD} beyond it")
        if any(verdict(row) == "against" for row in data["rows"]):
            caption.append(f", {AGAINST} beyond it against the push")
    caption.append(". ")
    caption.append_text(budget_words(data, mode))
    caption.rstrip()
    return caption


def budget_words(data: dict[str, Any], mode: str = "add") -> Text:
    """``within KL 0.25 on 16 neutral prompts: +0.4x, -0.4x.`` from the result's ``within_budget`` (nothing for an older result)."""
    reach = data.get("within_budget")
    if reach is None:
        return Text()
    unit = data["strength_unit"]
    picks = [shown_value(reach[sign], unit, mode) for sign in ("positive", "negative") if reach[sign] is not None]
    return Text.assemble(
        f"within KL {data['kl_budget']:g} on {data['neutral_prompts']} neutral prompts: ",
        (", ".join(picks) or "none", "bold"),
        ".",
    )


def fluent_rule(data: dict[str, Any]) -> Text:
    bound = data["bound"]
    return Text(
        f"fluent = distinct-2 ≥ {bound['distinct_2_ratio']:g}× the baseline's, longest run ≤ baseline's + "
        f"{bound['longest_run_slack']}, mean tokens ≥ {bound['length_ratio']:g}× the baseline's. "
        "enter on a row shows its full outputs.",
        style="dim",
    )
