"""SimHash fingerprints of texts and pairs, and an LSH index over bands that finds near-duplicates.

A fingerprint is a 64-bit SimHash: every feature of the normalised text is hashed
with BLAKE2b (8-byte digest, read big-endian), and bit *j* of the fingerprint is set
when more than half of the features have bit *j* set (the classic "sum of ±1 per bit
is positive" rule, written as a majority vote; a tie clears the bit). Texts that share
most of their features share most of their bits, so the Hamming distance between two
fingerprints estimates how different the texts are.

The features of a text are its word unigrams and its word bigrams (adjacent words
joined by one space), each counted as often as it occurs. Words are runs of letters,
digits and underscores, with inner apostrophes kept (``can't`` is one word), taken
from the normalised text, so punctuation is not a feature. A text without words has no
features and the fingerprint 0.

A pair's fingerprint is one SimHash over both sides' features, the negative side's
hashes XORed with :data:`NEGATIVE_TAG`. The tag makes a side part of every feature, so
a pair and the same two texts swapped are different pairs; and since the two sides
share most words, the bits where the tag is 1 vote on what differs between the sides
while the others vote on what they share. A XOR (rather than hashing ``"-" + feature``
again) lets both fingerprints reuse each side's one set of feature hashes.

The per-bit votes are counted in parallel: each feature hash is cached as a wide
integer with one 32-bit lane per bit (:func:`lanes`), so adding hashes is one big-integer
sum and the majority is read from all 64 lanes at once.

Nothing here imports torch: ``ster pairs inspect`` loads no model.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, pairwise

BITS = 64
MASK = (1 << BITS) - 1
LANE = 32
"""Bits per vote counter; a text may have up to 2**31 features."""

NEGATIVE_TAG = int.from_bytes(hashlib.blake2b(b"negative side", digest_size=8).digest(), "big")
"""XORed into the negative side's feature hashes in a pair fingerprint."""

PROBE_LIMIT = 1 << 16
"""Most bucket probes one lookup may make; past this the index scans its items instead (see the class)."""

_WORD = re.compile(r"\w+(?:['’]\w+)*")
_ONES = sum(1 << (LANE * j) for j in range(BITS))
_LANE_BYTES = [bytes(x for k in range(8) for x in ((b >> k) & 1, 0, 0, 0)) for b in range(256)]
_ASCII_BITS = bytes.maketrans(b"\x00\x01", b"01")


def _lane_mask(select: int) -> int:
    """Full lanes for the bits set in ``select``."""
    return sum(((1 << LANE) - 1) << (LANE * j) for j in range(BITS) if (select >> j) & 1)


_TAGGED_LANES, _UNTAGGED_LANES = _lane_mask(NEGATIVE_TAG), _lane_mask(~NEGATIVE_TAG & MASK)
_TAGGED_ONES = _ONES & _TAGGED_LANES


def normalise(text: str) -> str:
    """The form two texts are compared in, so case and layout do not make them differ.

    Unicode NFKC (full-width letters, ligatures and non-breaking spaces fold into their
    plain forms), then casefold (a stronger lower-casing: ``ß`` becomes ``ss``), then
    every run of whitespace becomes one space, with none at either end.
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def tokenize(normalised: str) -> list[str]:
    """The words of an already normalised text: the units of every feature and word count."""
    return _WORD.findall(normalised)


def words(text: str) -> list[str]:
    """The words of a raw text, normalised first."""
    return tokenize(normalise(text))


def features(word_list: list[str]) -> list[str]:
    """Unigrams, then bigrams; a space cannot occur inside a word, so the two never collide."""
    return [*word_list, *map(" ".join, pairwise(word_list))]


@lru_cache(maxsize=1 << 16)
def lanes(feature: str) -> int:
    """The feature's hash spread out, bit *j* at the bottom of lane *j*. Cached: vocabularies repeat."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(b"".join(map(_LANE_BYTES.__getitem__, digest[::-1])), "little")


@dataclass(frozen=True)
class Votes:
    """The per-bit vote counts of some features (one lane per bit) and how many features voted."""

    lanes: int
    count: int

    @classmethod
    def of(cls, word_list: list[str]) -> Votes:
        spread = list(map(lanes, features(word_list)))
        return cls(sum(spread), len(spread))

    def fingerprint(self) -> int:
        """Bit *j* set when lane *j* holds more than half the votes, all lanes compared at once.

        Adding ``2**31 - 1 - count // 2`` to every lane carries into the lane's top bit
        exactly when the lane's count is above ``count // 2``.
        """
        biased = (self.lanes + (2 ** (LANE - 1) - 1 - self.count // 2) * _ONES) >> (LANE - 1)
        majority = (biased & _ONES).to_bytes(BITS * LANE // 8, "little")[:: LANE // 8]
        return int(majority[::-1].translate(_ASCII_BITS), 2)

    def tagged(self) -> Votes:
        """These votes as if every hash had been XORed with :data:`NEGATIVE_TAG`: tagged lanes count the zeros."""
        flipped = self.count * _TAGGED_ONES - (self.lanes & _TAGGED_LANES)
        return Votes((self.lanes & _UNTAGGED_LANES) + flipped, self.count)

    def __add__(self, other: Votes) -> Votes:
        return Votes(self.lanes + other.lanes, self.count + other.count)


def fingerprint(text: str) -> int:
    """The 64-bit SimHash of one text's unigram and bigram features (see the module docstring)."""
    return Votes.of(words(text)).fingerprint()


def pair_votes(positive: Votes, negative: Votes) -> Votes:
    """The votes of a pair: the positive side's as they are, the negative side's tagged."""
    return positive + negative.tagged()


def pair_fingerprint(positive: str, negative: str) -> int:
    """One SimHash over both sides' features, the negative side tagged: what near-duplicate pairs are judged by."""
    return pair_votes(Votes.of(words(positive)), Votes.of(words(negative))).fingerprint()


def hamming(a: int, b: int) -> int:
    """How many bits two fingerprints differ in."""
    return (a ^ b).bit_count()


def band_spans(bands: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of each band: 64 bits cut into ``bands`` contiguous runs, widths differing by at most 1."""
    base, extra = divmod(BITS, bands)
    spans, shift = [], 0
    for band in range(bands):
        width = base + (band < extra)
        spans.append((shift, width))
        shift += width
    return spans


def _flip_masks(width: int, radius: int) -> list[int]:
    """Every mask of at most ``radius`` set bits within ``width`` bits, fewest bits first."""
    masks: list[int] = []
    for k in range(min(radius, width) + 1):
        masks.extend(sum(1 << bit for bit in chosen) for chosen in combinations(range(width), k))
    return masks


class NearDuplicateIndex:
    """An incremental index of fingerprints that answers "which earlier one is within ``bits``?", exactly.

    The 64 bits are cut into ``bands`` bands, and the bands into ``groups`` runs of
    consecutive bands: ``bits + 1`` groups while ``bits < bands``, else one group per
    band. Every added fingerprint is filed under its value in each group. By
    pigeonhole, two fingerprints ``d <= bits`` apart differ in at most
    ``radius = bits // groups`` bits of some group, so a lookup that probes, in every
    group, the buckets of all values within ``radius`` of its own meets every
    fingerprint within ``bits``. Candidates are confirmed by their full Hamming distance
    (at most ``bits``), so nothing farther is ever reported. The answer is never a sample:

    * ``bits < bands`` (the default 3 and 8): ``radius`` is 0, one bucket per group. Plain
      banded LSH (one bucket per band) would also be exact here, but each of its 8-bit
      buckets holds 1/256 of the set, so confirming candidates grows with the square of
      the set; the 4 groups of 2 bands the defaults give are 16 bits wide, 1/65536 each.
    * ``bits >= bands``: plain banded LSH would miss pairs at distances ``bands..bits``,
      so each band is multi-probed within ``radius``: ``bands * sum(C(width, k) for
      k <= radius)`` probes per lookup.

    When the probe count is at least the number of indexed items (a tiny index, or a
    radius so wide that probing costs more than looking), a lookup scans the items in
    order instead, which is exact too. ``comparisons`` counts the full distance checks
    made, so callers and tests can see the index never compares every pair with every other.
    """

    def __init__(self, bits: int, bands: int) -> None:
        if not 0 <= bits <= BITS:
            raise ValueError(f"bits must be between 0 and {BITS}")
        if not 1 <= bands <= BITS:
            raise ValueError(f"bands must be between 1 and {BITS}")
        self.bits, self.bands = bits, bands
        self.spans = _group_spans(band_spans(bands), min(bits + 1, bands))
        """``(shift, width)`` of each group of bands the buckets are keyed on."""
        self.radius = bits // len(self.spans)
        probes = sum(sum(math.comb(width, k) for k in range(min(self.radius, width) + 1)) for _, width in self.spans)
        self._probes = probes
        self._masks = [_flip_masks(width, self.radius) for _, width in self.spans] if probes <= PROBE_LIMIT else None
        self._buckets: list[dict[int, list[int]]] = [{} for _ in self.spans]
        self._items: list[int] = []
        self.comparisons = 0
        """Full Hamming-distance checks made by :meth:`find` so far."""

    def __len__(self) -> int:
        return len(self._items)

    def add(self, fp: int) -> int:
        """File a fingerprint under each of its group values; return its index (0, 1, 2, … in order of adding)."""
        index = len(self._items)
        self._items.append(fp)
        for (shift, width), buckets in zip(self.spans, self._buckets):
            buckets.setdefault((fp >> shift) & ((1 << width) - 1), []).append(index)
        return index

    def find(self, fp: int) -> tuple[int, int] | None:
        """The earliest added fingerprint within ``bits`` of ``fp`` as ``(index, distance)``, or None."""
        if self._masks is None or self._probes >= len(self._items):
            return self._scan(fp)
        best: tuple[int, int] | None = None
        for (shift, width), buckets, masks in zip(self.spans, self._buckets, self._masks):
            value = (fp >> shift) & ((1 << width) - 1)
            for mask in masks:
                bucket = buckets.get(value ^ mask)
                if bucket:
                    best = self._earliest_in(bucket, fp, best)
        return best

    def _earliest_in(self, bucket: list[int], fp: int, best: tuple[int, int] | None) -> tuple[int, int] | None:
        """Walk one bucket (indices ascending) until a match or an index no earlier than ``best``."""
        for index in bucket:
            if best is not None and index >= best[0]:
                break
            self.comparisons += 1
            distance = (fp ^ self._items[index]).bit_count()
            if distance <= self.bits:
                return index, distance
        return best

    def _scan(self, fp: int) -> tuple[int, int] | None:
        """Every item in order; the first within ``bits`` is the earliest."""
        for index, other in enumerate(self._items):
            self.comparisons += 1
            distance = (fp ^ other).bit_count()
            if distance <= self.bits:
                return index, distance
        return None


def _group_spans(spans: list[tuple[int, int]], groups: int) -> list[tuple[int, int]]:
    """Consecutive bands merged into ``groups`` runs, band counts differing by at most 1."""
    base, extra = divmod(len(spans), groups)
    merged, start = [], 0
    for group in range(groups):
        members = spans[start : start + base + (group < extra)]
        merged.append((members[0][0], sum(width for _, width in members)))
        start += len(members)
    return merged
