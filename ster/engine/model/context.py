"""What fits in a model's context: every text is counted against ``max_position_embeddings`` first.

A decoder has a position for each of ``max_position_embeddings`` tokens and nothing
beyond; past it the rotary angles are ones it never saw in training, and the attention
and cache grow without bound (a 5 MB pair side once asked for 38 TB). So every prompt,
pair side and generation budget is checked here, after the tokenizer is read and
before a weight is mapped, and refused in one sentence naming both numbers.

Counting a very long text exactly costs seconds (5 MB takes 3–5 s through a fast
tokenizer), so a text longer than :data:`PROBE_ABOVE` characters is first probed: its
first :data:`PROBE_CHARS_PER_POSITION` characters per position of the context, cut at a
space, are encoded, and when they alone hold more than :data:`PROBE_FACTOR` times the
context the text is refused with the probe's count as a lower bound. A tokenizer reads
the start of a text the same way whether or not more follows (up to the last word, which
the cut avoids), and the factor leaves room for any boundary effect; a text the probe
cannot decide (a long run of spaces, one endless word) is counted in full.
"""

from __future__ import annotations

from collections.abc import Callable

from ster.engine.model.codec import TextCodec
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import flag

PROBE_ABOVE = 65_536
"""Texts up to this many characters are counted in full (tens of milliseconds)."""
PROBE_CHARS_PER_POSITION = 16
"""Prose averages about 4 characters a token, so a probe this long holds about four times the context:
a prose text longer than the probe is refused from the probe alone."""
PROBE_FACTOR = 2
"""The probe refuses only when it counts more than this many times the context."""


def encode_within(codec: TextCodec, text: str, context: int, what: str) -> list[int]:
    """The ids ``codec.encode_prompt`` gives ``text``, or a refusal when they outnumber the context.

    ``what`` names the text at the start of the sentence: ``the prompt``, ``prompt 3``,
    ``pair 4's positive side``.
    """
    window = PROBE_CHARS_PER_POSITION * context
    if len(text) > max(window, PROBE_ABOVE):
        probe = len(codec.encode_prompt(_cut(text, window)))
        if probe > PROBE_FACTOR * context:
            raise Refusal(f"{what} is at least {probe} tokens long, more than the model's context of {context} tokens")
    ids = codec.encode_prompt(text)
    if len(ids) > context:
        raise Refusal(f"{what} is {len(ids)} tokens long, more than the model's context of {context} tokens")
    return ids


def encode_each(codec: TextCodec, texts: list[str], context: int, label: str) -> list[list[int]]:
    """:func:`encode_within` for each text, naming a refused one as ``{label} {index}`` (0-based)."""
    return [encode_within(codec, text, context, f"{label} {index}") for index, text in enumerate(texts)]


def encode_pairs(codec: TextCodec, pairs: list[tuple[str, str]], context: int) -> list[tuple[list[int], list[int]]]:
    """Both sides of every pair through :func:`encode_within`, naming a refused side by its pair's index."""
    return [
        (
            encode_within(codec, positive, context, f"pair {index}'s positive side"),
            encode_within(codec, negative, context, f"pair {index}'s negative side"),
        )
        for index, (positive, negative) in enumerate(pairs)
    ]


def _cut(text: str, window: int) -> str:
    """The first ``window`` characters, ended at the last space in their second half when there is one."""
    space = text.rfind(" ", window // 2, window)
    return text[:space] if space > 0 else text[:window]


def count_tokens(codec: TextCodec, text: str) -> int:
    """How many ids the text takes as a prompt; 0 for one that encodes to nothing (no refusal)."""
    try:
        return len(codec.encode_prompt(text))
    except Refusal:
        return 0


def generation_budget(
    prompt_tokens: int,
    requested: int | None,
    default: int,
    context: int,
    note: Callable[[str], None] = lambda sentence: None,
) -> int:
    """How many tokens to generate after the longest prompt of ``prompt_tokens`` tokens.

    An explicit ``requested`` that would run past the context is refused; ``None``
    means up to ``default``, as many as the context leaves room for (said through
    ``note`` when that is fewer).
    """
    room = context - prompt_tokens
    if room < 1:
        raise Refusal(
            f"the {prompt_tokens}-token prompt fills the model's context of {context} tokens, "
            f"leaving no room to generate"
        )
    if requested is None:
        if room < default:
            note(
                f"generating at most {room} tokens rather than the default {default}: the model's context of "
                f"{context} leaves that much room after the {prompt_tokens}-token prompt"
            )
        return min(default, room)
    if requested > room:
        raise Refusal(
            f"the {prompt_tokens}-token prompt and {flag('max_new_tokens')} {requested} need "
            f"{prompt_tokens + requested} positions, more than the model's context of {context}; "
            f"give {flag('max_new_tokens')} {room} or fewer"
        )
    return requested
