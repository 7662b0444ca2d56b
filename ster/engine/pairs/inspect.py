"""The ``pairs inspect`` job: duplicates, refusals, length balance and diversity of a pair set.

Every judgement is textual and no model is loaded (nor torch imported). One pass over
the pairs, in order, finds for each pair:

* ``duplicate``: exact when an earlier pair has the same normalised positive *and*
  negative (:func:`~ster.engine.pairs.simhash.normalise`), else near when an earlier
  pair's fingerprint (:func:`~ster.engine.pairs.simhash.pair_fingerprint`) is within
  ``dedupe_bits`` bits, found through the banded LSH index, so no pair is compared with
  every other. ``of`` names the earliest such pair: the first occurrence wins and the
  later pair is the one flagged. Every pair, flagged or not, joins the index, so a pair
  can be named as the near-duplicate of an earlier duplicate;
* ``positive_refusal`` / ``negative_refusal``: :func:`~ster.engine.pairs.refusals.flag`
  at ``refusal_threshold``;
* ``length_ratio``: longer side over shorter side in characters (an empty side counts
  as one character, so the ratio stays finite), rounded to 4 decimals; ``unbalanced_count``
  counts the reported ratios above :data:`UNBALANCED_RATIO`.

Diversity is measured over the positive sides (see :func:`diversity`).

With a model (``--model``), each side is also counted in tokens exactly as ``train``
encodes it (through the chat-template decision), from the checkpoint's tokenizer and
config alone — its weights are never read, nor torch imported — and ``too_long_count``
counts the pairs with a side longer than the model's context, which ``train``,
``optimize`` and ``evaluate`` would refuse.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations, pairwise
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from ster.engine.model.context import count_tokens
from ster.engine.model.loading import Checkpoint, model_store
from ster.engine.model.requests import ModelRequest
from ster.engine.pairs.model import Pair, PairSet
from ster.engine.pairs.refusals import RefusalFlag, flag
from ster.engine.pairs.requests import PairsInspectRequest
from ster.engine.pairs.simhash import NearDuplicateIndex, Votes, hamming, normalise, pair_votes, tokenize
from ster.engine.pairs.workspace import load_pairs_or_active
from ster.engine.protocol.jobs import JobContext

UNBALANCED_RATIO = 3.0
"""A pair whose longer side is more than this many times the shorter teaches length, not the trait."""
EXHAUSTIVE_LIMIT = 256
"""Up to this many texts the pairwise diversity measures use every pair of texts."""
SAMPLED_COMPARISONS = EXHAUSTIVE_LIMIT * (EXHAUSTIVE_LIMIT - 1) // 2
"""Above the limit, this many random pairs of texts: the work of the largest exhaustive case, whatever the size."""
PROGRESS_EVERY = 1000
"""Pairs between two progress callbacks (and cancellation checks) on a large set."""

Progress = Callable[[int, int], None]


class ExactDuplicate(BaseModel):
    """The pair repeats an earlier pair word for word once normalised."""

    kind: Literal["exact"] = "exact"
    of: int
    """Index of the earliest identical pair."""


class NearDuplicate(BaseModel):
    """The pair's fingerprint is within ``--dedupe-bits`` of an earlier pair's."""

    kind: Literal["near"] = "near"
    of: int
    """Index of the earliest pair within the distance."""
    distance: int
    """Bits the two pair fingerprints differ in."""


Duplicate = Annotated[ExactDuplicate | NearDuplicate, Field(discriminator="kind")]


class PairReport(BaseModel):
    """What inspection found about one pair."""

    index: int
    positive: str
    negative: str
    positive_chars: int
    negative_chars: int
    positive_words: int
    """Words as the fingerprints see them: runs of letters and digits, punctuation excluded."""
    negative_words: int
    duplicate: Duplicate | None
    positive_refusal: RefusalFlag | None
    negative_refusal: RefusalFlag | None
    length_ratio: float
    """Longer side over shorter side, in characters."""
    positive_tokens: int | None = None
    """The side's length in the model's tokens, as ``train`` encodes it; null without ``--model``."""
    negative_tokens: int | None = None


class Diversity(BaseModel):
    """How much a set of texts repeats itself; the pairwise measures are null for fewer than two texts."""

    unique_unigrams: int
    """Distinct words over all texts."""
    unique_bigrams: int
    """Distinct adjacent word pairs, taken within each text."""
    avg_jaccard: float | None
    """Mean Jaccard similarity of two texts' word sets (two wordless texts count as identical, 1.0)."""
    mean_simhash_hamming: float | None
    """Mean Hamming distance between two texts' fingerprints; 32 is unrelated, 0 the same."""
    min_simhash_hamming: int | None
    """The smallest such distance among the pairs compared (sampled above 256 texts, so it may miss the closest)."""


class PairsReport(BaseModel):
    """What ``ster pairs inspect`` prints."""

    trait_name: str
    pair_count: int
    duplicate_count: int
    refusal_count: int
    """Pairs with at least one side flagged as a refusal."""
    unbalanced_count: int
    """Pairs whose length_ratio is above 3.0."""
    too_long_count: int | None = None
    """Pairs with a side of more tokens than ``context``; null without ``--model``."""
    context: int | None = None
    """The model's ``max_position_embeddings``; null without ``--model``."""
    diversity: Diversity
    pairs: list[PairReport]


@dataclass(frozen=True)
class _Side:
    """One text in the forms every measure reads: normalised, split into words, and its SimHash votes."""

    normalised: str
    words: list[str]
    votes: Votes

    @classmethod
    def of(cls, text: str) -> _Side:
        normalised = normalise(text)
        words = tokenize(normalised)
        return cls(normalised, words, Votes.of(words))


def inspect_job(request: PairsInspectRequest, ctx: JobContext) -> PairsReport:
    """Inspect the set given in the request, or load it (the workspace's active one when no path is given)."""
    path: str | Path
    if request.pair_set is not None:
        path, pair_set = "the editor", request.pair_set
    else:
        path, pair_set = load_pairs_or_active(request.pairs)
    checkpoint = (
        None
        if request.model is None
        else model_store(ctx).open(
            ModelRequest(model=request.model, revision=request.revision, chat_template=request.chat_template), ctx
        )
    )
    total = len(pair_set.pairs)
    ctx.progress("inspect", f"inspecting {total} pairs from {path}", 0, total)

    def progress(done: int, of: int) -> None:
        ctx.check_cancelled()
        ctx.progress("inspect", f"inspected {done}/{of} pairs", done, of)

    report = inspect_pairs(
        pair_set,
        dedupe_bits=request.dedupe_bits,
        dedupe_bands=request.dedupe_bands,
        refusal_threshold=request.refusal_threshold,
        progress=progress,
    )
    return report if checkpoint is None else count_against_context(report, checkpoint, ctx)


def count_against_context(report: PairsReport, checkpoint: Checkpoint, ctx: JobContext) -> PairsReport:
    """The report with each side's token count in the checkpoint's tokens, and the pairs too long for it."""
    context, codec = checkpoint.context, checkpoint.codec
    ctx.progress("count", f"counting both sides of {report.pair_count} pairs in {checkpoint.source.model}'s tokens")
    pairs = []
    for pair in report.pairs:
        ctx.check_cancelled()
        pairs.append(
            pair.model_copy(
                update={
                    "positive_tokens": count_tokens(codec, pair.positive),
                    "negative_tokens": count_tokens(codec, pair.negative),
                }
            )
        )
    too_long = sum(max(p.positive_tokens or 0, p.negative_tokens or 0) > context for p in pairs)
    return report.model_copy(update={"pairs": pairs, "too_long_count": too_long, "context": context})


def inspect_pairs(
    pair_set: PairSet,
    *,
    dedupe_bits: int = 3,
    dedupe_bands: int = 8,
    refusal_threshold: float = 0.5,
    seed: int = 0,
    progress: Progress | None = None,
) -> PairsReport:
    """Inspect every pair in order, then the diversity of the positive sides.

    ``progress(done, total)`` is called every :data:`PROGRESS_EVERY` pairs, so a job
    can report and check for cancellation; ``seed`` drives the diversity sampling.
    """
    finder = _DuplicateFinder(dedupe_bits, dedupe_bands)
    reports: list[PairReport] = []
    texts: list[list[str]] = []
    prints: list[int] = []
    total = len(pair_set.pairs)
    for index, pair in enumerate(pair_set.pairs):
        positive, negative = _Side.of(pair.positive), _Side.of(pair.negative)
        texts.append(positive.words)
        prints.append(positive.votes.fingerprint())
        reports.append(
            _pair_report(index, pair, positive, negative, finder.check(positive, negative), refusal_threshold)
        )
        if progress is not None and (index + 1) % PROGRESS_EVERY == 0:
            progress(index + 1, total)
    return PairsReport(
        trait_name=pair_set.trait_name,
        pair_count=total,
        duplicate_count=sum(r.duplicate is not None for r in reports),
        refusal_count=sum(r.positive_refusal is not None or r.negative_refusal is not None for r in reports),
        unbalanced_count=sum(r.length_ratio > UNBALANCED_RATIO for r in reports),
        diversity=diversity(texts, prints, seed=seed),
        pairs=reports,
    )


def _pair_report(
    index: int,
    pair: Pair,
    positive: _Side,
    negative: _Side,
    duplicate: ExactDuplicate | NearDuplicate | None,
    threshold: float,
) -> PairReport:
    return PairReport(
        index=index,
        positive=pair.positive,
        negative=pair.negative,
        positive_chars=len(pair.positive),
        negative_chars=len(pair.negative),
        positive_words=len(positive.words),
        negative_words=len(negative.words),
        duplicate=duplicate,
        positive_refusal=flag(pair.positive, threshold),
        negative_refusal=flag(pair.negative, threshold),
        length_ratio=length_ratio(pair.positive, pair.negative),
    )


def length_ratio(positive: str, negative: str) -> float:
    """Longer over shorter in characters, rounded to 4 decimals; an empty side counts as one character."""
    longer, shorter = sorted((max(len(positive), 1), max(len(negative), 1)), reverse=True)
    return round(longer / shorter, 4)


class _DuplicateFinder:
    """Exact duplicates by normalised text, near ones by the LSH index; every pair joins both."""

    def __init__(self, bits: int, bands: int) -> None:
        self.index = NearDuplicateIndex(bits, bands)
        self.first: dict[tuple[str, str], int] = {}

    def check(self, positive: _Side, negative: _Side) -> ExactDuplicate | NearDuplicate | None:
        """The earlier pair this one duplicates, if any; then remember this one."""
        key = (positive.normalised, negative.normalised)
        fp = pair_votes(positive.votes, negative.votes).fingerprint()
        earlier = self.first.get(key)
        found = None if earlier is not None else self.index.find(fp)
        index = self.index.add(fp)
        self.first.setdefault(key, index)
        if earlier is not None:
            return ExactDuplicate(of=earlier)
        return NearDuplicate(of=found[0], distance=found[1]) if found is not None else None


def comparison_pairs(count: int, seed: int) -> list[tuple[int, int]]:
    """Which pairs of texts the pairwise measures compare.

    Every pair ``i < j`` up to :data:`EXHAUSTIVE_LIMIT` texts; above it,
    :data:`SAMPLED_COMPARISONS` pairs of two different texts drawn uniformly (with
    replacement) by ``random.Random(seed)``, so the cost stays flat as sets grow and a
    seed gives the same numbers every run.
    """
    if count <= EXHAUSTIVE_LIMIT:
        return list(combinations(range(count), 2))
    rng = random.Random(seed)
    drawn = []
    for _ in range(SAMPLED_COMPARISONS):
        first, second = rng.randrange(count), rng.randrange(count - 1)
        drawn.append((first, second + (second >= first)))
    return drawn


def jaccard(a: set[str], b: set[str]) -> float:
    """Shared words over all words of the two; two empty sets are identical (1.0)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def diversity(texts: list[list[str]], prints: list[int], *, seed: int = 0) -> Diversity:
    """Vocabulary size and pairwise similarity of texts given as word lists, with their fingerprints.

    The pairwise measures (``avg_jaccard``, ``mean_simhash_hamming``,
    ``min_simhash_hamming``) run over :func:`comparison_pairs` and are null when there
    are fewer than two texts, since there is nothing to compare. Means are rounded to 6
    decimals.
    """
    unigrams = {word for words in texts for word in words}
    bigrams = {pair for words in texts for pair in pairwise(words)}
    compared = comparison_pairs(len(texts), seed)
    if not compared:
        return Diversity(
            unique_unigrams=len(unigrams),
            unique_bigrams=len(bigrams),
            avg_jaccard=None,
            mean_simhash_hamming=None,
            min_simhash_hamming=None,
        )
    sets = [set(words) for words in texts]
    distances = [hamming(prints[i], prints[j]) for i, j in compared]
    return Diversity(
        unique_unigrams=len(unigrams),
        unique_bigrams=len(bigrams),
        avg_jaccard=round(sum(jaccard(sets[i], sets[j]) for i, j in compared) / len(compared), 6),
        mean_simhash_hamming=round(sum(distances) / len(distances), 6),
        min_simhash_hamming=min(distances),
    )
