"""``ster onboarding``: the walkthrough, its saved progress, and what ends it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.pairs.first_use import note_pair_set_written, read_state, state_path
from ster.engine.pairs.onboarding import SCREENS, Screen
from ster.engine.pairs.workspace import workspace_root


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def write_set(path: Path, trait: str = "calm", count: int = 2) -> Path:
    pairs = [{"positive": f"{trait} yes {i}", "negative": f"{trait} no {i}"} for i in range(count)]
    path.write_text(json.dumps({"trait_name": trait, "pairs": pairs}))
    return path


def saved() -> dict:
    return json.loads(state_path().read_text())


def test_progress_lives_under_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert state_path() == tmp_path / "state" / "ster" / "onboarding.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_path() == tmp_path / "home" / ".local" / "state" / "ster" / "onboarding.json"


def test_the_screens_are_data_that_teach_the_first_steps() -> None:
    assert isinstance(SCREENS, tuple) and 4 <= len(SCREENS) <= 6
    assert all(isinstance(s, Screen) and s.title and s.body for s in SCREENS)
    text = "\n".join(s.body for s in SCREENS)
    for needle in (
        "positive",
        "negative",
        "differ only in the trait",
        "ster pairs add",
        "ster workspace import-pairs",
        "ster onboarding --import-pairs",
        "ster pairs synthesize",
        "ster optimize --model ster:toy --pairs ster:pairs --output runs/calm.ster.json",
        'ster generate --model ster:toy --vector runs/calm.ster.json --strength 0.4x --prompt "question : '
        'tell me about the town . answer :"',
    ):
        assert needle in text, needle


def test_first_run_shows_every_screen_as_a_log_event_and_saves_progress(cli) -> None:
    run = cli("--json", "onboarding")
    assert run.code == 0, run.out
    events = run.events
    logs = [e["message"] for e in events if e["type"] == "log"]
    for screen in SCREENS:
        assert sum(screen.title in m and screen.body in m for m in logs) == 1
    result = events[-1]
    assert result["type"] == "result" and result["command"] == "onboarding"
    data = result["data"]
    assert data["status"] == "in_progress" and data["how"] is None and data["imported"] is None
    assert [Screen(**s) for s in data["screens"]] == list(SCREENS)
    assert "imported" in data["ends_when"] and "written" in data["ends_when"]
    assert saved() == {
        "schema_version": 1,
        "completed": False,
        "completed_at": None,
        "how": None,
        "screens_seen": len(SCREENS),
    }
    again = cli("onboarding")  # not complete yet: the walkthrough is shown again
    assert again.json["status"] == "in_progress" and SCREENS[0].body in again.err


def test_import_pairs_completes_it_and_a_replay_says_so_without_the_screens(cli, tmp_path: Path) -> None:
    source = write_set(tmp_path / "calm.json")
    run = cli("onboarding", "--import-pairs", source, "--name", "mine")
    assert run.code == 0, run.err
    data = run.json
    assert data["status"] == "complete" and data["how"] == "imported mine" and data["screens"] == []
    assert data["imported"]["status"] == "imported" and data["imported"]["id"] == "mine"
    assert (workspace_root() / "pairs" / "mine.json").is_file()
    assert saved()["completed"] is True and saved()["how"] == "imported mine"
    replay = cli("--json", "onboarding")
    logs = [e["message"] for e in replay.events if e["type"] == "log"]
    assert logs == [
        f"onboarding is already complete (imported mine, {data['completed_at']}); "
        "run ster onboarding --reset to see the walkthrough again"
    ]
    assert replay.events[-1]["data"]["status"] == "complete" and replay.events[-1]["data"]["screens"] == []
    unchanged = cli("onboarding", "--import-pairs", source)  # same outcomes as workspace import-pairs
    assert unchanged.json["imported"]["status"] == "unchanged" and unchanged.json["how"] == "imported mine"


def test_import_pairs_with_reset_starts_the_record_over_and_completes_it(cli, tmp_path: Path) -> None:
    source = write_set(tmp_path / "calm.json")
    first = cli("onboarding", "--import-pairs", source, "--name", "first")
    assert first.code == 0, first.err
    run = cli("onboarding", "--import-pairs", source, "--reset")
    assert run.code == 0, run.err
    assert run.json["status"] == "complete" and run.json["how"] == f"imported {run.json['imported']['id']}"
    assert saved()["completed"] is True and saved()["completed_at"] == run.json["completed_at"]


def test_import_refusals_are_the_workspace_ones_and_write_nothing(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"trait_name": "calm", "pairs": []}')
    run = cli("onboarding", "--import-pairs", bad)
    assert run.code == 1 and run.err.strip() == f"error: pair set {bad} contains no pairs"
    assert not state_path().exists() and not workspace_root().exists()
    cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    state_before = state_path().read_bytes()
    other = tmp_path / "other"
    other.mkdir()
    conflict = cli("onboarding", "--import-pairs", write_set(other / "calm.json", count=3))
    assert conflict.code == 1 and "conflicting" in conflict.err
    assert str(workspace_root() / "pairs" / "calm.json") in conflict.err
    assert state_path().read_bytes() == state_before
    lone_name = cli("onboarding", "--name", "x")
    assert lone_name.code == 1 and "needs --import-pairs" in lone_name.err


def test_workspace_import_also_ends_the_walkthrough(cli, tmp_path: Path) -> None:
    cli("onboarding")
    cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    assert saved()["completed"] is True and saved()["how"] == "imported calm"
    assert saved()["screens_seen"] == len(SCREENS)


def test_reset_starts_over(cli, tmp_path: Path) -> None:
    cli("onboarding", "--import-pairs", write_set(tmp_path / "calm.json"))
    run = cli("--json", "onboarding", "--reset")
    assert run.code == 0
    logs = [e["message"] for e in run.events if e["type"] == "log"]
    assert "onboarding progress was reset" in logs[0] and len(logs) == 1 + len(SCREENS) + 1
    assert run.events[-1]["data"]["status"] == "in_progress"
    assert saved()["completed"] is False and saved()["screens_seen"] == len(SCREENS)


def test_note_pair_set_written_completes_it_once(cli, tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    note_pair_set_written(first)
    state = read_state()
    assert state.completed and state.how == f"wrote {first}" and state.completed_at
    note_pair_set_written(second)  # already complete: the first completion is kept
    assert read_state() == state
    assert cli("onboarding").json["how"] == f"wrote {first}"


def test_pairs_add_ends_the_walkthrough(cli, tmp_path: Path) -> None:
    path = tmp_path / "pairs.json"
    run = cli("pairs", "add", "--pairs", path, "--trait", "calm", "--positive", "a", "--negative", "b")
    assert run.code == 0, run.err
    assert saved()["completed"] is True and saved()["how"] == f"wrote {path}"


def test_note_pair_set_written_never_raises_on_filesystem_trouble(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    note_pair_set_written(tmp_path / "pairs.json")  # cannot create blocker/ster: swallowed
    assert blocker.read_text().startswith("a file")


def test_damaged_progress_is_refused_until_reset_and_replaced_by_a_write(cli, tmp_path: Path) -> None:
    state_path().parent.mkdir(parents=True)
    state_path().write_text("{")
    run = cli("onboarding")
    assert run.code == 1 and "is not valid JSON" in run.err and "run ster onboarding --reset" in run.err
    assert state_path().read_text() == "{"
    assert cli("onboarding", "--reset").json["status"] == "in_progress"
    state_path().write_text("{")
    note_pair_set_written(tmp_path / "pairs.json")
    assert saved()["completed"] is True


def test_progress_that_cannot_be_saved_is_a_warning_not_a_failure(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    run = cli("--json", "onboarding")
    assert run.code == 0
    warnings = [e["message"] for e in run.events if e["type"] == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith("onboarding progress was not saved: ")
