"""Edits of one pair set from many processes at once: every edit lands, none is lost.

Each test starts real ``python -m ster`` processes together, so their read-modify-writes
overlap; without the lock in :func:`ster.engine.pairs.edit.editing` these tests lose pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

WRITERS = 2
EDITS_EACH = 20


def _start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ster", *args],
        cwd=cwd,
        env=os.environ.copy(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(processes: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    return [(p.wait(timeout=300), p.communicate()[1]) for p in processes]


def _seed(path: Path, count: int) -> None:
    pairs = [{"positive": f"seed p{i}", "negative": f"seed n{i}"} for i in range(count)]
    path.write_text(json.dumps({"trait_name": "calm", "pairs": pairs}))


def test_parallel_adds_to_one_set_keep_every_pair(tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    _seed(path, 1)
    texts = [f"writer {w} pair {i}" for w in range(WRITERS) for i in range(EDITS_EACH)]
    processes = [
        _start("pairs", "add", "--pairs", str(path), "--positive", text, "--negative", text + " not", cwd=REPO)
        for text in texts
    ]
    outcomes = _finish(processes)
    assert [code for code, _ in outcomes] == [0] * len(texts), [err for _, err in outcomes if err]
    document = json.loads(path.read_text())
    assert len(document["pairs"]) == 1 + WRITERS * EDITS_EACH
    assert sorted(p["positive"] for p in document["pairs"][1:]) == sorted(texts)


def test_parallel_adds_and_removes_end_with_the_exact_count(tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    _seed(path, 20)
    adds = [
        _start("pairs", "add", "--pairs", str(path), "--positive", f"p{i}", "--negative", f"n{i}", cwd=REPO)
        for i in range(10)
    ]
    removes = [_start("pairs", "remove", "--pairs", str(path), "--index", "0", cwd=REPO) for _ in range(10)]
    outcomes = _finish(adds + removes)
    assert [code for code, _ in outcomes] == [0] * 20, [err for _, err in outcomes if err]
    assert len(json.loads(path.read_text())["pairs"]) == 20
