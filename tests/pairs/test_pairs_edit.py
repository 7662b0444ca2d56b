"""``ster pairs add`` and ``ster pairs remove``: pretty, validated, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def add(cli, path: Path, positive: str, negative: str, *extra: str):
    return cli("pairs", "add", "--pairs", path, "--positive", positive, "--negative", negative, *extra)


def test_add_creates_the_file_and_its_directory(cli, tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "pairs.json"
    run = add(cli, path, "the sea is calm .", "the sea is wild .", "--trait", "calm")
    assert run.code == 0, run.err
    assert run.json == {
        "pairs": str(path),
        "action": "added",
        "index": 0,
        "created": True,
        "trait_name": "calm",
        "pair_count": 1,
    }
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "trait_name"')
    assert json.loads(text) == {
        "trait_name": "calm",
        "pairs": [{"positive": "the sea is calm .", "negative": "the sea is wild ."}],
    }


def test_add_appends_and_trait_replaces_the_name(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    add(cli, path, "a", "b", "--trait", "calm")
    run = add(cli, path, "c", "d", "--trait", "serene")
    assert run.json["index"] == 1 and run.json["created"] is False
    document = json.loads(path.read_text())
    assert document["trait_name"] == "serene" and [p["positive"] for p in document["pairs"]] == ["a", "c"]


def test_add_to_a_new_file_needs_no_trait_and_leaves_the_set_unnamed(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    run = add(cli, path, "a", "b")
    assert run.code == 0, run.err
    assert run.json["trait_name"] == "" and run.json["created"] is True
    assert json.loads(path.read_text()) == {"trait_name": "", "pairs": [{"positive": "a", "negative": "b"}]}
    named = add(cli, path, "c", "d", "--trait", "calm")
    assert named.json["trait_name"] == "calm"
    kept = add(cli, path, "e", "f")
    assert kept.json["trait_name"] == "calm", "an add without --trait keeps the name the set has"


def test_a_pair_set_without_trait_name_loads_with_an_empty_name(cli, tmp_path: Path) -> None:
    path = tmp_path / "unnamed.json"
    path.write_text(json.dumps({"pairs": [{"positive": "the sea is calm .", "negative": "the sea is wild ."}]}))
    inspected = cli("pairs", "inspect", "--pairs", path)
    assert inspected.code == 0, inspected.err
    assert inspected.json["trait_name"] == "" and inspected.json["pair_count"] == 1
    run = add(cli, path, "the lake is calm .", "the lake is wild .")
    assert run.code == 0 and run.json["pair_count"] == 2 and run.json["trait_name"] == ""


def test_add_refusals_leave_the_file_untouched(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    add(cli, path, "a", "b", "--trait", "calm")
    before = path.read_bytes()
    empty = add(cli, path, "a", "   ")
    assert empty.code == 1
    assert empty.err.strip().endswith(f"pair set {path} contains an empty positive or negative prompt")
    assert path.read_bytes() == before
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert add(cli, broken, "a", "b").code == 1 and broken.read_text() == "{"
    duplicated = tmp_path / "duplicated.json"
    duplicated.write_text('{"trait_name": "calm", "trait_name": "wild", "pairs": [{"positive": "a", "negative": "b"}]}')
    before = duplicated.read_bytes()
    twice = add(cli, duplicated, "c", "d")
    assert twice.code == 1 and 'gives the key "trait_name" twice' in twice.err
    assert duplicated.read_bytes() == before


def test_a_refused_add_to_a_new_directory_creates_nothing(cli, tmp_path: Path) -> None:
    run = add(cli, tmp_path / "new" / "pairs.json", "a", " ")
    assert run.code == 1 and not (tmp_path / "new").exists()


def test_remove_and_its_two_refusals(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    for i in range(3):
        add(cli, path, f"p{i}", f"n{i}", "--trait", "calm")
    run = cli("pairs", "remove", "--pairs", path, "--index", "1")
    assert run.code == 0 and run.json["pair_count"] == 2
    assert [p["positive"] for p in json.loads(path.read_text())["pairs"]] == ["p0", "p2"]
    outside = cli("pairs", "remove", "--pairs", path, "--index", "5")
    assert outside.code == 1 and outside.err.strip().endswith("pair index 5 is outside the set's 0..1 range")
    cli("pairs", "remove", "--pairs", path, "--index", "0")
    before = path.read_bytes()
    last = cli("pairs", "remove", "--pairs", path, "--index", "0")
    assert last.code == 1 and last.err.strip().endswith(f"pair set {path} contains no pairs")
    assert path.read_bytes() == before


def test_a_file_of_another_kind_is_named_not_edited(cli, tmp_path: Path) -> None:
    artifact = tmp_path / "calm.json"
    assert cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", artifact, "--layers", "3").code == 0
    before = artifact.read_bytes()
    run = add(cli, artifact, "a", "b")
    assert run.code == 1 and run.err.strip() == f"error: {artifact} is a steering artifact, not a pair set"
    assert artifact.read_bytes() == before
    train = cli("train", "--model", "ster:toy", "--pairs", artifact, "--output", tmp_path / "out.json")
    assert train.code == 1 and "is a steering artifact, not a pair set" in train.err
