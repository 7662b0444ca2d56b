"""Local pair synthesis on SmolLM2-135M-Instruct (``real`` marker; CI runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.pairs.refusals import flag

pytestmark = pytest.mark.real


def test_local_synthesis_keeps_well_formed_pairs_without_refusals(
    cli, smol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    out = tmp_path / "calm.json"
    run = cli(
        "pairs",
        "synthesize",
        "--model",
        smol,
        "--trait",
        "calm and reassuring",
        "--count",
        "4",
        "--output",
        out,
        "--max-new-tokens",
        "64",
    )
    assert run.code == 0, run.err
    report = run.json
    assert report["generator"] == f"local:{smol}" and report["kept"] >= 3
    assert report["attempts"] == (
        report["kept"] + report["rejected_empty"] + report["rejected_refusals"] + report["rejected_duplicates"]
    )
    pairs = json.loads(out.read_text())["pairs"]
    assert len(pairs) == report["kept"]
    for pair in pairs:
        positive_question, positive_answer = pair["positive"].split("\nAnswer: ")
        negative_question, negative_answer = pair["negative"].split("\nAnswer: ")
        assert positive_question == negative_question and positive_question.startswith("Question: ")
        assert positive_question.endswith("?") and positive_answer.strip() and negative_answer.strip()
        assert flag(positive_answer, 0.5) is None and flag(negative_answer, 0.5) is None
    assert len({pair["positive"] for pair in pairs}) == len(pairs)
