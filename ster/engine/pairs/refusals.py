"""Does a text read as a refusal? Ten weighted phrase families and one combining rule.

A refusal in a pair set is a useless example: it differs from the other side along
the refusal axis instead of along the trait. The scorer is deliberately phrase-based
and conservative. A lone word that refusals use ("cannot", "sorry", "decline",
"policy") is weak evidence, because ordinary sentences use it too ("I cannot believe
how beautiful the sunset was", "Sorry I'm late"); what scores high is the shape of a
refusal: a first person, a modal, and an act of assisting, providing or complying
("I can't assist with that request"), a disclaimer ("As an AI language model"), or an
appeal to the rules the speaker runs under ("against my guidelines").

Each phrase carries a weight in (0, 1]. A family's evidence is its heaviest phrase
that matches (ties: the earliest in the text). The score of a text is

    the heaviest family's weight + 0.1 for each other family that also matched,

capped at 1.0 and rounded to 4 decimals. Each family counts once, so repeating one
phrase adds nothing, while a second kind of evidence ("I'm sorry, but" before "I can't
help with that") corroborates the first. The family and snippet reported are the
heaviest family's (ties: the earliest match, then the order of :data:`FAMILIES`), and
the snippet is the matched text exactly as it appears in the input.

Patterns match case-insensitively at word boundaries; a space in a phrase matches any
run of whitespace and an apostrophe matches ``'`` or ``’``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel

CORROBORATION = 0.1
"""Added to the score for every family beyond the heaviest one that also matched."""

_GATE_WORD = re.compile(r"\w+(?:'\w+)*")

# Fragments shared by the phrases below; each is a non-capturing group.
_F = {
    "I": r"(?:i)",
    "IM": r"(?:i'm|i am|im)",
    "ID": r"(?:i'd|i would)",
    "CANT": r"(?:cannot|can not|can't|cant)",
    "WONT": r"(?:won't|will not|wont)",
    "DONT": r"(?:don't|do not|dont)",
    "I_REFUSE": (
        r"(?:i (?:cannot|can not|can't|cant|won't|will not|wont|must not|shouldn't|should not)|"
        r"(?:i'm|i am|im) not going to)"
    ),
    "I_UNABLE": r"(?:i (?:cannot|can not|can't|won't|will not)|(?:i'm|i am|im) (?:unable|not able))",
    "ASSIST": r"(?:help|assist)",
    "OBJ": r"(?:that|this|it|your|such|those|these|the request|any of that|anything like that)",
    "ACT": (
        r"(?:provide|comply|fulfil|fulfill|generate|create|produce|engage in|engage with|give you|offer|"
        r"share|write|participate in)"
    ),
    "DISCUSS": r"(?:answer|discuss|talk about|respond to|comment on|go into|get into)",
}


@dataclass(frozen=True)
class Phrase:
    """One pattern of a family and how strongly it reads as a refusal."""

    pattern: re.Pattern[str]
    weight: float


def _phrase(template: str, weight: float) -> Phrase:
    """Compile a phrase: fragments filled in, spaces as any whitespace, apostrophes either kind, word-bounded."""
    source = template.format(**_F).replace("'", "['’]").replace(" ", r"\s+")
    return Phrase(re.compile(rf"(?<!\w){source}(?!\w)", re.IGNORECASE), weight)


@dataclass(frozen=True)
class Family:
    """A family's phrases, and the words one of which every phrase contains.

    The trigger words are a cheap gate: a text none of whose words is a trigger cannot
    match any phrase of the family, so its regular expressions are not run at all.
    That keeps scoring tens of thousands of ordinary texts fast.
    """

    triggers: frozenset[str]
    phrases: tuple[Phrase, ...]


def _family(triggers: str, *phrases: Phrase) -> Family:
    return Family(frozenset(triggers.split()), phrases)


FAMILIES: dict[str, Family] = {
    "ai_disclaimer": _family(
        "ai artificial language chatbot virtual",
        _phrase(r"as an? (?:ai|artificial intelligence)(?: (?:language model|model|assistant|chatbot|system))?", 0.9),
        _phrase(r"as an? (?:large )?language model", 0.9),
        _phrase(
            r"{IM} (?:just |only |merely )?an? (?:ai|artificial intelligence|language model|chatbot|"
            r"virtual assistant|ai assistant)",
            0.8,
        ),
        _phrase(r"being an? (?:ai|language model)", 0.7),
    ),
    "policy": _family(
        "guidelines policies policy programming principles rules terms",
        _phrase(
            r"(?:against|violates?|violating|breach(?:es)?|contrary to) (?:my|our|openai's|the (?:content|usage|"
            r"safety|ethical)) (?:\w+ )?(?:guidelines|policies|policy|programming|principles|rules|"
            r"terms of (?:use|service))",
            0.85,
        ),
        _phrase(
            r"(?:against|violates?|violating|breach(?:es)?) (?:the )?(?:content|usage|safety) "
            r"polic(?:y|ies)",
            0.85,
        ),
        _phrase(
            r"(?:my|our) (?:guidelines|policies|programming|principles) (?:do not|don't|does not|doesn't|won't) "
            r"(?:allow|permit|let)",
            0.85,
        ),
        _phrase(r"(?:content|usage|safety) polic(?:y|ies)", 0.3),
    ),
    "apology_hedge": _family(
        "afraid apologise apologize sorry unfortunately",
        _phrase(r"{IM} afraid {I_UNABLE}", 0.7),
        _phrase(r"{I} apologi[sz]e,? but", 0.5),
        _phrase(r"{IM} (?:so |very |really |truly )?sorry,? but {I}", 0.35),
        _phrase(r"sorry,? but {I} (?:cannot|can not|can't|won't|will not)", 0.45),
        _phrase(r"unfortunately,? {I_UNABLE}", 0.45),
    ),
    "unable": _family(
        "unable able",
        _phrase(
            r"{IM} (?:unable|not able) to (?:{ASSIST}|{ACT}|{DISCUSS}|do that|do this|fulfil+ (?:this|that|"
            r"your))",
            0.8,
        ),
        _phrase(r"(?:{WONT}|wouldn't|would not) be able to (?:{ASSIST}|{ACT}|{DISCUSS})", 0.75),
        _phrase(r"unable to (?:comply|assist|fulfil+|help) (?:with )?(?:this|that|your|such) (?:request|query)", 0.85),
        _phrase(r"{IM} (?:unable|not able) to", 0.4),
    ),
    "cannot_action": _family(
        "cannot can't cant won't wont shouldn't not",
        _phrase(r"{I_REFUSE} {ASSIST}(?: you)?(?: with)? {OBJ}", 0.8),
        _phrase(r"{I_REFUSE} {ASSIST}(?: you)?(?=\s*[.!;]|$)", 0.8),
        _phrase(
            r"{I_REFUSE} (?:provide|comply|fulfil|fulfill|generate|produce|engage in|engage with|"
            r"participate in)",
            0.75,
        ),
        _phrase(r"{I_REFUSE} (?:create|write|share|give you|offer) {OBJ}", 0.7),
        _phrase(
            r"{I_REFUSE} {DISCUSS} (?:that|this)(?! (?:with|for|yet|until|without|definitively|"
            r"precisely|exactly|in))",
            0.6,
        ),
    ),
    "prefer_rather": _family(
        "rather prefer subject topic else",
        _phrase(r"{ID} (?:rather|prefer) not (?:to )?(?:{DISCUSS}|{ASSIST}|share|engage|say|speculate|weigh in)", 0.75),
        _phrase(
            r"(?:let's|let us|{ID} (?:rather|prefer to)) (?:change the (?:subject|topic)|talk about something else|"
            r"focus on something else)",
            0.6,
        ),
        _phrase(r"{ID} (?:rather|prefer) not", 0.35),
    ),
    "decline_refuse": _family(
        "decline refuse",
        _phrase(
            r"(?:i (?:must|have to|will have to|need to|will|am going to)|i'll(?: have to)?|i'm going to)"
            r"(?: respectfully| politely)? decline",
            0.85,
        ),
        _phrase(r"{I} (?:respectfully|politely) decline", 0.85),
        _phrase(r"{I} (?:refuse|decline) to (?:{ASSIST}|{ACT}|{DISCUSS}|do that|do this|engage|take part)", 0.7),
        _phrase(r"(?:must|have to) (?:decline|refuse) (?:this|that|your) request", 0.85),
    ),
    "no_support": _family(
        "something request topic anything condone endorse encourage promote support assistance help",
        _phrase(
            r"(?:not|isn't|is not) (?:something|a request|a topic|anything) (?:that )?(?:i (?:can|am able "
            r"to|will|could)|i'm able to) (?:help with|assist with|support|provide|engage with|do)",
            0.8,
        ),
        _phrase(r"{I} (?:{CANT}|{WONT}|{DONT}|do not|must not) (?:condone|endorse|encourage|promote)", 0.7),
        _phrase(
            r"(?:{CANT}|unable to) (?:provide|offer|give) (?:support|assistance|help) (?:for|with) "
            r"(?:this|that|such|your)",
            0.8,
        ),
        _phrase(r"{I} (?:{CANT}|{WONT}) support (?:this|that|your) (?:request|kind of)", 0.7),
    ),
    "no_ability": _family(
        "beyond opinions emotions feelings beliefs preferences consciousness body real ability capability capacity "
        "access capable able means",
        _phrase(r"beyond (?:my|the scope of my) (?:capabilities|abilities|programming|scope)", 0.7),
        _phrase(
            r"{I} (?:{DONT}|do not) have (?:personal )?(?:opinions|emotions|feelings|beliefs|preferences|"
            r"consciousness|a (?:physical )?body|real-time (?:information|data|access))(?! (?:for|about|toward))",
            0.6,
        ),
        _phrase(r"{I} (?:{DONT}|do not) have (?:the )?(?:ability|capability|capacity) to", 0.55),
        _phrase(r"{I} (?:{DONT}|do not) have access to (?:the internet|real-time|current|personal|your)", 0.55),
        _phrase(
            r"{IM} not (?:capable|able) of (?:providing|generating|browsing|accessing|performing|giving|helping)", 0.55
        ),
        _phrase(r"{I} (?:{DONT}|do not) have the (?:means|access)", 0.3),
    ),
    "refusal_word": _family(
        "request prompt query say no refuse refusing refusal refused decline declined declining permitted prohibited "
        "inappropriate unethical",
        _phrase(r"(?:request|prompt|query) (?:denied|refused|rejected|declined)", 0.7),
        _phrase(r"(?:i (?:have to|must|will have to)|i'll have to) say no", 0.6),
        _phrase(r"no,? {I} (?:{WONT})(?: (?:do|help with|answer|write|say|share) (?:that|this|it))?(?=\s*[.!]|$)", 0.6),
        _phrase(
            r"(?:refuse|refusing|refusal|refused|declined?|declining|not permitted|prohibited|inappropriate|"
            r"unethical)",
            0.25,
        ),
    ),
}
"""The ten families, in reporting order for ties, each with its trigger words and phrases."""


class RefusalFlag(BaseModel):
    """Why a text reads as a refusal: its score, the family that weighed most, and the text it matched."""

    score: float
    """0 to 1: the heaviest family's weight plus 0.1 per other family that matched, capped at 1."""
    family: str
    """One of the ten family names."""
    snippet: str
    """The matched text as it appears in the input."""


@dataclass(frozen=True)
class _Match:
    weight: float
    start: int
    order: int
    family: str
    snippet: str


def _family_match(order: int, name: str, family: Family, text: str) -> _Match | None:
    """The family's heaviest matching phrase, the earliest one on a tie."""
    best: _Match | None = None
    for phrase in family.phrases:
        found = phrase.pattern.search(text)
        if found and (best is None or (-phrase.weight, found.start()) < (-best.weight, best.start)):
            best = _Match(phrase.weight, found.start(), order, name, found.group(0))
    return best


def _matches(text: str, gated: bool = True) -> list[_Match]:
    """Each family's evidence in ``text``; ``gated=False`` runs every phrase (the tests' reference)."""
    present = set(_GATE_WORD.findall(text.lower().replace("’", "'")))
    return [
        m
        for order, (name, family) in enumerate(FAMILIES.items())
        if not (gated and family.triggers.isdisjoint(present))
        and (m := _family_match(order, name, family, text)) is not None
    ]


def score(text: str) -> RefusalFlag | None:
    """The strongest refusal evidence in ``text`` and its combined score; None when no phrase matched."""
    matches = _matches(text)
    if not matches:
        return None
    top = min(matches, key=lambda m: (-m.weight, m.start, m.order))
    combined = min(1.0, top.weight + CORROBORATION * (len(matches) - 1))
    return RefusalFlag(score=round(combined, 4), family=top.family, snippet=top.snippet)


def flag(text: str, threshold: float) -> RefusalFlag | None:
    """The refusal flag of ``text`` when its score is at least ``threshold``; None otherwise."""
    found = score(text)
    return found if found is not None and found.score >= threshold else None
