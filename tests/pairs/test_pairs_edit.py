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
    assert run.json == {"pairs": str(path), "action": "added", "index": 0, "created": True, "trait_name": "calm",
                        "pair_count": 1}
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith("{\n  \"trait_name\"")
    assert json.loads(text) == {"trait_name": "calm", "pairs": [{"positive": "the sea is calm .",
                                                                 "negative": "the sea is wild ."}]}


def test_add_appends_and_trait_replaces_the_name(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    add(cli, path, "a", "b", "--trait", "calm")
    run = add(cli, path, "c", "d", "--trait", "serene")
    assert run.json["index"] == 1 and run.json["created"] is False
    document = json.loads(path.read_text())
    assert document["trait_name"] == "serene" and [p["positive"] for p in document["pairs"]] == ["a", "c"]


def test_add_refusals_leave_the_file_untouched(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    missing_trait = add(cli, path, "a", "b")
    assert missing_trait.code == 1 and "give --trait to name the trait" in missing_trait.err and not path.exists()
    add(cli, path, "a", "b", "--trait", "calm")
    before = path.read_bytes()
    empty = add(cli, path, "a", "   ")
    assert empty.code == 1
    assert empty.err.strip().endswith(f"pair set {path} contains an empty positive or negative prompt")
    assert path.read_bytes() == before
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert add(cli, broken, "a", "b").code == 1 and broken.read_text() == "{"


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
