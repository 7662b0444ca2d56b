"""``ster pairs inspect``: fingerprints against an independent SimHash, the LSH index against brute
force, the refusal scorer on refusals and on ordinary sentences, every report field, and the CLI."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import subprocess
import sys
import unicodedata
from itertools import combinations
from pathlib import Path

import pytest

from ster.engine.pairs.inspect import SAMPLED_COMPARISONS, comparison_pairs, inspect_pairs
from ster.engine.pairs.model import Pair, PairSet
from ster.engine.pairs.refusals import FAMILIES, RefusalFlag, _matches, flag, score
from ster.engine.pairs.simhash import (
    NEGATIVE_TAG,
    NearDuplicateIndex,
    fingerprint,
    hamming,
    normalise,
    pair_fingerprint,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "ster" / "data" / "examples" / "pairs.json"


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


# --- an independent SimHash, written from the documented definition ------------------------------


def reference_words(text: str) -> list[str]:
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return re.findall(r"\w+(?:['’]\w+)*", folded)


def reference_hashes(text: str, xor: int = 0) -> list[int]:
    words = reference_words(text)
    grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
    return [int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big") ^ xor for g in grams]


def reference_simhash(hashes: list[int]) -> int:
    sums = [sum(1 if (h >> bit) & 1 else -1 for h in hashes) for bit in range(64)]
    return sum(1 << bit for bit, total in enumerate(sums) if total > 0)


def random_text(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30)))


def test_normalise_folds_case_width_and_whitespace() -> None:
    assert normalise("  The\tSEA\n is  ＣＡＬＭ.  ") == "the sea is calm."
    assert normalise("Straße") == "strasse"


def test_fingerprints_equal_an_independent_simhash() -> None:
    rng = random.Random(7)
    vocab = ["sea", "calm", "wild", "can't", "Town", "river,", "42", "é", "the", "is"]
    tag = int.from_bytes(hashlib.blake2b(b"negative side", digest_size=8).digest(), "big")
    assert NEGATIVE_TAG == tag
    for _ in range(200):
        positive, negative = random_text(rng, vocab), random_text(rng, vocab)
        assert fingerprint(positive) == reference_simhash(reference_hashes(positive))
        expected = reference_simhash(reference_hashes(positive) + reference_hashes(negative, tag))
        assert pair_fingerprint(positive, negative) == expected
    assert fingerprint("") == fingerprint("?!") == 0


def test_pair_fingerprints_ignore_layout_but_not_sides() -> None:
    calm, wild = "the sea is calm", "the sea is wild"
    assert pair_fingerprint("The sea is calm.", "The sea is WILD") == pair_fingerprint("the  sea is calm", wild + "!")
    assert pair_fingerprint(calm, wild) != pair_fingerprint(wild, calm)
    assert hamming(0b1011, 0b0001) == 2 and hamming(0, (1 << 64) - 1) == 64


# --- the index against brute force -------------------------------------------------------------


def clustered_fingerprints(count: int, seed: int) -> list[int]:
    """Random fingerprints, most of them a few bits away from an earlier one."""
    rng = random.Random(seed)
    prints: list[int] = []
    for _ in range(count):
        if prints and rng.random() < 0.7:
            base = rng.choice(prints)
            for bit in rng.sample(range(64), rng.randint(0, 12)):
                base ^= 1 << bit
            prints.append(base)
        else:
            prints.append(rng.getrandbits(64))
    return prints


def brute_force(prints: list[int], bits: int) -> list[tuple[int, int] | None]:
    found = []
    for i, fp in enumerate(prints):
        found.append(
            next(((j, hamming(fp, other)) for j, other in enumerate(prints[:i]) if hamming(fp, other) <= bits), None)
        )
    return found


def indexed(prints: list[int], bits: int, bands: int) -> tuple[list[tuple[int, int] | None], NearDuplicateIndex]:
    index = NearDuplicateIndex(bits, bands)
    found = []
    for i, fp in enumerate(prints):
        found.append(index.find(fp))
        assert index.add(fp) == i
    return found, index


@pytest.mark.parametrize(("bits", "bands"), [(3, 8), (0, 8), (7, 8), (2, 16), (3, 64), (8, 8), (10, 8), (5, 2), (3, 1)])
def test_the_index_finds_exactly_what_brute_force_finds(bits: int, bands: int) -> None:
    """Below ``bands`` by pigeonhole, and at or above it too, through multi-probing."""
    prints = clustered_fingerprints(600, seed=bits * 100 + bands)
    found, _ = indexed(prints, bits, bands)
    assert found == brute_force(prints, bits)
    assert any(f is not None and f[1] == bits for f in found)  # matches at the limit are found too


def test_the_index_does_not_compare_every_pair() -> None:
    prints = clustered_fingerprints(2000, seed=1)
    found, index = indexed(prints, 3, 8)
    assert sum(f is not None for f in found) > 100
    assert index.comparisons < 2000 * 1999 // 2 // 100


def test_the_index_answers_the_earliest_match() -> None:
    index = NearDuplicateIndex(3, 8)
    for fp in (0b111, 0b1, 0b0):
        index.add(fp)
    assert index.find(0) == (0, 3) and index.find(0b110) == (0, 1)
    assert NearDuplicateIndex(0, 8).find(5) is None
    with pytest.raises(ValueError):
        NearDuplicateIndex(3, 0)


# --- refusals ----------------------------------------------------------------------------------

REFUSALS = [
    ("As an AI language model, I cannot help with that.", "ai_disclaimer"),
    ("I'm just an AI, so I can't give medical advice.", "ai_disclaimer"),
    ("I'm sorry, but I can't assist with that request.", "cannot_action"),
    ("I’m not going to help you with that.", "cannot_action"),
    ("I will not provide instructions for that.", "cannot_action"),
    ("I must decline to answer.", "decline_refuse"),
    ("I respectfully decline.", "decline_refuse"),
    ("I refuse to write that.", "decline_refuse"),
    ("That goes against my guidelines.", "policy"),
    ("Creating that content would violate the usage policy.", "policy"),
    ("My guidelines do not allow me to share that.", "policy"),
    ("I'd rather not discuss this.", "prefer_rather"),
    ("I'd prefer not to answer that question.", "prefer_rather"),
    ("Let's change the subject.", "prefer_rather"),
    ("I am unable to provide that information.", "unable"),
    ("I won't be able to help with this.", "unable"),
    ("I apologize, but I am not able to comply with that.", "unable"),
    ("I'm afraid I can't do that, Dave.", "apology_hedge"),
    ("I cannot condone or encourage that kind of behaviour.", "no_support"),
    ("That's not something I can help with.", "no_support"),
    ("I don't have the ability to browse the internet.", "no_ability"),
    ("Writing malware is beyond my capabilities.", "no_ability"),
    ("I don't have personal opinions on politics.", "no_ability"),
    ("Request denied.", "refusal_word"),
    ("No, I won't.", "refusal_word"),
    ("I have to say no to this one.", "refusal_word"),
]

ORDINARY = [
    "I cannot believe how beautiful the sunset was.",
    "Sorry I'm late, the train was delayed.",
    "You cannot park here after six.",
    "She said no to the second slice of cake.",
    "I can't help but smile when I see her.",
    "He refused the offer politely and went home.",
    "I'm sorry for your loss.",
    "We cannot assume the data is complete.",
    "I have not seen a replication, so I cannot claim it did.",
    "The policy on returns is printed on the receipt.",
    "As an artist, I prefer oil paints to acrylics.",
    "I'd rather walk than take the bus.",
    "The AI model predicted rain for tomorrow.",
    "I am unable to contain my excitement!",
    "I declined the meeting because I was travelling.",
    "Unfortunately, the store was closed.",
    "I don't have the means to buy a new car right now.",
    "Sorry, but I think you dropped your keys.",
    "It is against the rules to run by the pool.",
    "I can't wait to see you again!",
    "I won't forget this trip.",
    "I don't have feelings for him anymore.",
    "No, I think the blue one is nicer.",
    "I can't answer that with certainty, but the evidence points to yes.",
    "I'm not able to swim very well.",
    "I would rather not go out tonight, I'm tired.",
    "The language model course starts on Monday.",
]


@pytest.mark.parametrize(("text", "family"), REFUSALS)
def test_refusals_are_flagged_with_their_family(text: str, family: str) -> None:
    found = flag(text, 0.5)
    assert found is not None and found.score >= 0.5 and found.family == family
    assert found.snippet in text  # verbatim, as it appears in the input


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_sentences_are_not_flagged(text: str) -> None:
    found = score(text)
    assert found is None or found.score < 0.5
    assert flag(text, 0.5) is None


def test_every_family_is_reachable_and_the_word_gate_changes_nothing() -> None:
    assert list(FAMILIES) == [
        "ai_disclaimer",
        "policy",
        "apology_hedge",
        "unable",
        "cannot_action",
        "prefer_rather",
        "decline_refuse",
        "no_support",
        "no_ability",
        "refusal_word",
    ]
    assert {family for _, family in REFUSALS} == set(FAMILIES)
    for text in [t for t, _ in REFUSALS] + ORDINARY:
        assert _matches(text) == _matches(text, gated=False)


def test_scores_combine_by_the_documented_rule() -> None:
    assert score("As an AI language model").model_dump() == {
        "score": 0.9,
        "family": "ai_disclaimer",
        "snippet": "As an AI language model",
    }
    # the heaviest family (0.9) plus 0.1 for the cannot_action phrase, capped at 1
    assert score("As an AI language model, I cannot help with that.").score == 1.0
    # a family counts once however often it matches; a weak word alone stays weak
    assert score("I refuse to write that. I refuse to write that.").score == score("I refuse to write that.").score
    assert score("He refused.") == RefusalFlag(score=0.25, family="refusal_word", snippet="refused")
    assert score("AS AN AI LANGUAGE   MODEL").snippet == "AS AN AI LANGUAGE   MODEL"
    assert flag("As an AI language model", 0.95) is None and flag("As an AI language model", 0.9) is not None
    assert score("The sea is calm today.") is None


# --- the report ---------------------------------------------------------------------------------


def pair_set(*pairs: tuple[str, str]) -> PairSet:
    return PairSet(trait_name="calm", pairs=[Pair(positive=p, negative=n) for p, n in pairs])


def near_variant(positive: str, negative: str, bits: int = 3) -> tuple[str, str, int]:
    """A pair whose words differ from the given one but whose fingerprint is 1..bits away (found by search)."""
    base = pair_fingerprint(positive, negative)
    for word in (
        "quietly",
        "softly",
        "gently",
        "slowly",
        "kindly",
        "warmly",
        "calmly",
        "surely",
        "truly",
        "evenly",
        "lightly",
        "simply",
        "plainly",
        "fairly",
        "nearly",
        "mostly",
        "rarely",
        "barely",
    ):
        candidate = f"{negative} {word}"
        distance = hamming(base, pair_fingerprint(positive, candidate))
        if 1 <= distance <= bits:
            return positive, candidate, distance
    raise AssertionError("no near variant in the word list")


QUESTION = "question : tell me about the harbour at dawn . answer :"
LONG_P = f"{QUESTION} the harbour is still , the boats rest and all is well ."
LONG_N = f"{QUESTION} the harbour is burning , the boats sink and we must run ."


def test_exact_duplicates_flag_the_later_pair_and_name_the_first() -> None:
    report = inspect_pairs(
        pair_set(
            ("the sea is calm", "the sea is wild"),
            ("the town is slow", "the town burns"),
            ("The sea  is CALM", "the sea is wild"),
            ("the sea is calm", "the sea is wild"),
        )
    )
    assert [p.duplicate.model_dump() if p.duplicate else None for p in report.pairs] == [
        None,
        None,
        {"kind": "exact", "of": 0},
        {"kind": "exact", "of": 0},
    ]
    assert report.duplicate_count == 2


def test_near_duplicates_report_the_earliest_pair_and_the_distance() -> None:
    positive, negative, distance = near_variant(LONG_P, LONG_N)
    report = inspect_pairs(
        pair_set(
            (LONG_P, LONG_N),
            ("the sea is calm", "the sea is wild"),
            (positive, negative),
            (LONG_P + "!", LONG_N + " ..."),
        )
    )
    dumped = [p.model_dump(mode="json")["duplicate"] for p in report.pairs]
    assert dumped == [
        None,
        None,
        {"kind": "near", "of": 0, "distance": distance},
        {"kind": "near", "of": 0, "distance": 0},
    ]  # punctuation is not a feature
    assert report.duplicate_count == 2
    strict = inspect_pairs(pair_set((LONG_P, LONG_N), (positive, negative)), dedupe_bits=0)
    assert strict.pairs[1].duplicate is None


def test_per_pair_counts_ratio_and_refusals() -> None:
    report = inspect_pairs(
        pair_set(
            ("Hello, world!", "can't stop"),
            ("a" * 10, "b" * 40),
            ("a" * 10, "b" * 30),
            ("abcdefg", "xyz"),
            ("The sea is calm.", "I'm sorry, but I can't assist with that request."),
            ("As an AI language model, I cannot help with that.", "I must decline to answer."),
        )
    )
    first = report.pairs[0]
    assert (first.positive_chars, first.negative_chars, first.positive_words, first.negative_words) == (13, 10, 2, 2)
    assert [p.length_ratio for p in report.pairs[:4]] == [1.3, 4.0, 3.0, 2.3333]
    assert report.pairs[4].length_ratio == 3.0  # 48 / 16
    assert report.unbalanced_count == 1  # only 4.0: exactly 3.0 is not above 3.0
    assert report.pairs[4].positive_refusal is None
    assert report.pairs[4].negative_refusal.family == "cannot_action"
    assert report.pairs[5].positive_refusal.model_dump() == {
        "score": 1.0,
        "family": "ai_disclaimer",
        "snippet": "As an AI language model",
    }
    assert report.pairs[5].negative_refusal.family == "decline_refuse"
    assert report.refusal_count == 2
    assert (
        inspect_pairs(
            report_set := pair_set(("The sea is calm.", "I must decline to answer.")), refusal_threshold=0.99
        ).refusal_count
        == 0
    )
    assert inspect_pairs(report_set).refusal_count == 1


def test_keys_come_in_the_documented_order_and_the_report_is_deterministic_json() -> None:
    pairs = pair_set(("the sea is calm", "the sea is wild"), ("the sea is calm", "the sea is wild"))
    document = inspect_pairs(pairs).model_dump(mode="json")
    assert list(document) == [
        "trait_name",
        "pair_count",
        "duplicate_count",
        "refusal_count",
        "unbalanced_count",
        "too_long_count",
        "context",
        "diversity",
        "pairs",
    ]
    assert list(document["diversity"]) == [
        "unique_unigrams",
        "unique_bigrams",
        "avg_jaccard",
        "mean_simhash_hamming",
        "min_simhash_hamming",
    ]
    assert list(document["pairs"][0]) == [
        "index",
        "positive",
        "negative",
        "positive_chars",
        "negative_chars",
        "positive_words",
        "negative_words",
        "duplicate",
        "positive_refusal",
        "negative_refusal",
        "length_ratio",
        "positive_tokens",
        "negative_tokens",
    ]
    assert list(document["pairs"][1]["duplicate"]) == ["kind", "of"]
    assert json.dumps(document, allow_nan=False) == json.dumps(inspect_pairs(pairs).model_dump(mode="json"))


def test_diversity_on_a_hand_computed_set() -> None:
    positives = ["the sea is calm", "The sea is quiet.", "a calm lake"]
    report = inspect_pairs(pair_set(*((p, "x y") for p in positives)))
    # words: {the, sea, is, calm}, {the, sea, is, quiet}, {a, calm, lake}
    # unigrams: the sea is calm quiet a lake = 7; bigrams: the-sea sea-is is-calm is-quiet a-calm calm-lake = 6
    # jaccard: 3/5, 1/6, 0/7
    prints = [reference_simhash(reference_hashes(p)) for p in positives]
    distances = [hamming(a, b) for a, b in combinations(prints, 2)]
    assert report.diversity.model_dump() == {
        "unique_unigrams": 7,
        "unique_bigrams": 6,
        "avg_jaccard": pytest.approx((3 / 5 + 1 / 6 + 0) / 3, abs=1e-6),
        "mean_simhash_hamming": pytest.approx(sum(distances) / 3, abs=1e-6),
        "min_simhash_hamming": min(distances),
    }


def test_a_one_pair_set_has_nothing_to_compare() -> None:
    diversity = inspect_pairs(pair_set(("the sea is calm", "the sea is wild"))).diversity
    assert diversity.model_dump() == {
        "unique_unigrams": 4,
        "unique_bigrams": 3,
        "avg_jaccard": None,
        "mean_simhash_hamming": None,
        "min_simhash_hamming": None,
    }


def test_above_256_texts_the_pairwise_measures_are_sampled_with_the_seed() -> None:
    assert comparison_pairs(256, 0) == list(combinations(range(256), 2))
    sampled = comparison_pairs(300, 0)
    assert len(sampled) == SAMPLED_COMPARISONS and all(i != j for i, j in sampled)
    assert sampled == comparison_pairs(300, 0) and sampled != comparison_pairs(300, 1)
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    pairs = pair_set(*((" ".join(rng.choice(vocab) for _ in range(8)), "x") for _ in range(300)))
    report = inspect_pairs(pairs, seed=5)
    assert report.diversity == inspect_pairs(pairs, seed=5).diversity
    sets = [set(reference_words(p.positive)) for p in pairs.pairs]
    exact = sum(len(a & b) / len(a | b) for a, b in combinations(sets, 2)) / (300 * 299 / 2)
    assert report.diversity.avg_jaccard == pytest.approx(exact, abs=0.01)


# --- the command ----------------------------------------------------------------------------------


def write_set(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text(json.dumps({"trait_name": "calm", "pairs": [{"positive": p, "negative": n} for p, n in pairs]}))
    return path


def test_the_cli_prints_the_report(cli, tmp_path: Path) -> None:
    path = write_set(
        tmp_path / "pairs.json",
        [
            ("the sea is calm", "the sea is wild"),
            ("The sea is calm", "the sea is wild"),
            ("I'd rather not discuss this.", "the sea is wild"),
        ],
    )
    run = cli("pairs", "inspect", "--pairs", path)
    assert run.code == 0, run.err
    assert run.json["pair_count"] == 3 and run.json["duplicate_count"] == 1 and run.json["refusal_count"] == 1
    assert run.json["pairs"][1]["duplicate"] == {"kind": "exact", "of": 0}
    assert run.json["pairs"][2]["positive_refusal"] == {
        "score": 0.75,
        "family": "prefer_rather",
        "snippet": "I'd rather not discuss",
    }
    strict = cli("pairs", "inspect", "--pairs", path, "--refusal-threshold", "0.8", "--dedupe-bits", "0")
    assert strict.code == 0 and strict.json["refusal_count"] == 0
    events = cli("--json", "pairs", "inspect", "--pairs", path).events
    assert events[0]["type"] == "progress" and events[0]["stage"] == "inspect"
    assert events[-1]["type"] == "result" and events[-1]["command"] == "pairs inspect"


def test_the_bundled_example_set_inspects_cleanly(cli) -> None:
    run = cli("pairs", "inspect", "--pairs", EXAMPLE)
    assert run.code == 0, run.err
    report = run.json
    assert report["trait_name"] == "calm" and report["pair_count"] == len(report["pairs"]) == 12
    assert (report["duplicate_count"], report["refusal_count"], report["unbalanced_count"]) == (0, 0, 0)
    assert all(
        p["duplicate"] is None and p["positive_refusal"] is None and p["negative_refusal"] is None
        for p in report["pairs"]
    )


@pytest.mark.parametrize(
    ("content", "sentence"),
    [
        (None, "pair set {path} does not exist"),
        (
            "{",
            "pair set {path} is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        ('{"trait_name": "calm", "pairs": []}', "pair set {path} contains no pairs"),
        (
            '{"trait_name": "calm", "pairs": [{"positive": "a", "negative": " "}]}',
            "pair set {path} contains an empty positive or negative prompt",
        ),
    ],
)
def test_bad_input_is_refused_in_one_sentence(cli, tmp_path: Path, content: str | None, sentence: str) -> None:
    path = tmp_path / "pairs.json"
    if content is not None:
        path.write_text(content)
    run = cli("pairs", "inspect", "--pairs", path)
    assert run.code == 1 and run.out == ""
    assert run.err.strip().splitlines()[-1].endswith(sentence.format(path=path))


def _inspect_in_a_fresh_interpreter(*flags: str) -> dict:
    """Run ``pairs inspect`` on the example in a new interpreter; assert it loaded nothing heavy; its report."""
    code = (
        "import sys; from ster.cli import main; status = main(['pairs', 'inspect', '--pairs', *sys.argv[1:]]); "
        "heavy = sorted(m for m in ('torch', 'transformers', 'textual', 'safetensors') if m in sys.modules); "
        "print('HEAVY', heavy, status, file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE), *flags], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY [] 0" in proc.stderr
    return json.loads(proc.stdout)


def test_inspection_imports_no_torch() -> None:
    assert _inspect_in_a_fresh_interpreter()["pair_count"] == 12


def test_large_sets_report_progress_and_stop_when_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ster.engine.pairs import inspect as inspection
    from ster.engine.pairs.requests import PairsInspectRequest
    from ster.engine.protocol.errors import Cancelled
    from ster.engine.protocol.jobs import JobContext

    monkeypatch.setattr(inspection, "PROGRESS_EVERY", 2)
    seen: list[tuple[int, int]] = []
    inspect_pairs(pair_set(*((f"calm {i}", f"wild {i}") for i in range(5))), progress=lambda *a: seen.append(a))
    assert seen == [(2, 5), (4, 5)]
    path = write_set(tmp_path / "pairs.json", [(f"calm {i}", f"wild {i}") for i in range(5)])
    events: list = []
    ctx = JobContext(events.append)
    ctx.cancel.set()
    with pytest.raises(Cancelled):
        inspection.inspect_job(PairsInspectRequest(pairs=path), ctx)
    assert [e.message for e in events] == [f"inspecting 5 pairs from {path}"]


# --- with a model: sides counted against its context -------------------------------------------------

LONG = "the sea is calm . " * 30
"""151 tokens on the toy, whose context is 128."""


def test_with_a_model_each_side_is_counted_against_its_context(cli, tmp_path: Path) -> None:
    path = write_set(
        tmp_path / "pairs.json",
        [("the sea is calm", "the sea is wild"), (LONG, "the sea is wild"), ("the sea is calm", LONG + LONG)],
    )
    plain = cli("pairs", "inspect", "--pairs", path).json
    assert (plain["too_long_count"], plain["context"]) == (None, None)
    assert all(p["positive_tokens"] is None and p["negative_tokens"] is None for p in plain["pairs"])
    run = cli("pairs", "inspect", "--pairs", path, "--model", "ster:toy")
    assert run.code == 0, run.err
    report = run.json
    assert (report["too_long_count"], report["context"]) == (2, 128)
    assert [(p["positive_tokens"], p["negative_tokens"]) for p in report["pairs"]] == [(5, 5), (151, 5), (5, 301)]
    assert {k: v for k, v in report.items() if k not in ("too_long_count", "context", "pairs")} == {
        k: v for k, v in plain.items() if k not in ("too_long_count", "context", "pairs")
    }
    refused = cli("train", "--model", "ster:toy", "--pairs", path, "--output", tmp_path / "o.json")
    assert refused.code == 1 and "pair 1's positive side is 151 tokens long" in refused.err


def test_the_count_follows_the_chat_template_as_train_does(cli, tmp_path: Path) -> None:
    path = write_set(tmp_path / "pairs.json", [("what is the river like ?", "the sea is wild")])
    applied = cli("pairs", "inspect", "--pairs", path, "--model", "ster:toy-chat").json["pairs"][0]
    off = cli("pairs", "inspect", "--pairs", path, "--model", "ster:toy-chat", "--chat-template", "off").json
    assert applied["positive_tokens"] > off["pairs"][0]["positive_tokens"] == 7


def test_a_bad_model_is_refused_before_the_pairs_are_read(cli, tmp_path: Path) -> None:
    run = cli("pairs", "inspect", "--pairs", EXAMPLE, "--model", tmp_path / "nowhere")
    assert run.code == 1
    assert run.err.strip().splitlines()[-1] == f"error: model directory {tmp_path / 'nowhere'} does not exist"
    assert "inspecting" not in run.err


def test_counting_with_a_model_reads_no_weights_and_imports_no_torch() -> None:
    assert _inspect_in_a_fresh_interpreter("--model", "ster:toy")["too_long_count"] == 0


@pytest.mark.real
def test_smollm2_counts_sides_as_train_encodes_them(cli, tmp_path: Path, smol: Path) -> None:
    from ster.engine.model.loading import ModelStore
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.requests import GenerateRequest

    report = cli("pairs", "inspect", "--pairs", EXAMPLE, "--model", smol).json
    codec = ModelStore().open(GenerateRequest(model=str(smol), prompt="x"), JobContext(lambda e: None)).codec
    pairs = json.loads(EXAMPLE.read_text())["pairs"]
    assert report["context"] == 8192 and report["too_long_count"] == 0
    assert [(p["positive_tokens"], p["negative_tokens"]) for p in report["pairs"]] == [
        (len(codec.encode_prompt(p["positive"])), len(codec.encode_prompt(p["negative"]))) for p in pairs
    ]
