"""The Pairs pane's text: the set summary, the highlighted pair in full, each row's flag cells."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

if TYPE_CHECKING:
    from ster.engine.pairs.model import Pair, PairSet


def summary_text(pair_set: PairSet, report: dict[str, Any] | None, inspecting: bool) -> Text:
    """The set's counts and diversity from its report; what is happening when there is no report."""
    if report is None and not pair_set.pairs:
        return Text("no pairs yet", style="dim")
    if report is None:
        why = "inspecting…" if inspecting else "flags unknown: the inspection did not end; any change runs it again"
        return Text(f"{len(pair_set.pairs)} pairs · {why}", style="dim")
    d = report["diversity"]
    text = Text(f"{report['pair_count']} pair{'s' if report['pair_count'] != 1 else ''} · ")
    for count, label in (
        (report["duplicate_count"], "duplicate"),
        (report["refusal_count"], "refusal"),
        (report["unbalanced_count"], "unbalanced"),
    ):
        plural = "s" if count != 1 and label != "unbalanced" else ""
        text.append(f"{count} {label}{plural}", style="bold yellow" if count else "")
        text.append(" · ")
    text.append(f"diversity: {d['unique_unigrams']} words, {d['unique_bigrams']} bigrams", style="dim")
    if d["avg_jaccard"] is not None:
        text.append(
            f", mean jaccard {d['avg_jaccard']:.3f}, simhash mean {d['mean_simhash_hamming']:.1f} "
            f"min {d['min_simhash_hamming']}",
            style="dim",
        )
    return text


def detail_text(pair: Pair, row: dict[str, Any] | None) -> Text:
    """Both sides in full, then what the report says about them, with the refusal's matched words."""
    text = Text.assemble(("+ ", "bold green"), pair.positive, "\n", ("- ", "bold red"), pair.negative)
    for side in ("positive", "negative"):
        flag = (row or {}).get(f"{side}_refusal")
        if flag:
            text.append(
                f'\n{side} side reads as a refusal: {flag["family"]} {flag["score"]:.2f}, "{flag["snippet"]}"',
                style="red",
            )
    return text


def flag_cells(row: dict[str, Any]) -> tuple[Text, Text, Text]:
    """The duplicate, refusal and ratio cells of one pair's report."""
    from ster.engine.pairs.inspect import UNBALANCED_RATIO  # loaded already by the job that made the report

    duplicate = row["duplicate"]
    dup = "" if duplicate is None else f"{duplicate['kind']} of {duplicate['of']}"
    if duplicate and duplicate["kind"] == "near":
        dup += f" ({duplicate['distance']} bits)"
    refusals = [
        f"{sign} {flag['family']} {flag['score']:.2f}"
        for sign, flag in (("+", row["positive_refusal"]), ("-", row["negative_refusal"]))
        if flag
    ]
    ratio = row["length_ratio"]
    return (
        Text(dup, style="yellow"),
        Text("  ".join(refusals), style="red"),
        Text(f"{ratio:.2f}", style="bold red" if ratio > UNBALANCED_RATIO else ""),
    )


def clip(text: str, width: int) -> str:
    """One line of at most ``width`` characters; a cut is marked so it is not read as the whole text."""
    line = " ↵ ".join(text.splitlines())
    return line if len(line) <= width else line[: width - 1] + "…"


def distinct_parts(positive: str, negative: str, width: int) -> tuple[str, str]:
    """Both sides clipped to ``width``, starting where they stop sharing words when a shared
    opening would fill the column: the difference is what a reader needs to see."""
    shared = 0
    for a, b in zip(positive.split(" "), negative.split(" ")):
        if a != b:
            break
        shared += len(a) + 1
    if shared < width // 2:
        return clip(positive, width), clip(negative, width)
    return clip("…" + positive[shared:], width), clip("…" + negative[shared:], width)
