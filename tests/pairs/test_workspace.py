"""``ster workspace``: canonical copies, the active set, the three import outcomes, and a locked index."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.pairs.workspace import active_pairs, import_pair_set, workspace_root
from ster.engine.protocol.errors import Refusal
from tests.conftest import REPO, run_subprocess

EXAMPLE_PAIRS = EXAMPLES_DIR / "pairs.json"


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def write_set(path: Path, trait: str = "calm", count: int = 2, indent: int | None = None) -> Path:
    pairs = [{"positive": f"{trait} yes {i}", "negative": f"{trait} no {i}"} for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trait_name": trait, "pairs": pairs}, indent=indent))
    return path


def index() -> dict:
    return json.loads((workspace_root() / "index.json").read_text())


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")) if root.exists() else []


def test_root_follows_xdg_data_home_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert workspace_root() == tmp_path / "data" / "ster"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert workspace_root() == tmp_path / "home" / ".local" / "share" / "ster"


def test_import_keeps_a_canonical_copy_and_makes_it_active(cli, tmp_path: Path) -> None:
    source = write_set(tmp_path / "calm.json")  # compact JSON: the copy is the pretty canonical form
    run = cli("workspace", "import-pairs", source)
    assert run.code == 0, run.err
    copy = workspace_root() / "pairs" / "calm.json"
    result = run.json
    assert result["status"] == "imported" and result["id"] == "calm" and result["active"] == "calm"
    assert result["path"] == str(copy) and result["pair_count"] == 2 and result["trait_name"] == "calm"
    assert result["source"] == str(source.resolve())
    text = copy.read_text()
    assert text.startswith('{\n  "trait_name": "calm"') and text.endswith("}\n")
    assert json.loads(text) == json.loads(source.read_text())
    entry = index()["entries"][0]
    assert index()["schema_version"] == 1 and index()["active"] == "calm"
    assert entry["file"] == "pairs/calm.json" and len(entry["digest"]) == 64 and entry["source"] == str(source)
    assert active_pairs() == copy
    assert "imported" in run.err and '"calm"' in run.err


def test_name_sets_the_id(cli, tmp_path: Path) -> None:
    run = cli("workspace", "import-pairs", write_set(tmp_path / "x.json"), "--name", "serene-v2")
    assert run.code == 0 and run.json["id"] == "serene-v2"
    assert (workspace_root() / "pairs" / "serene-v2.json").is_file()


def test_same_content_under_another_name_is_unchanged_and_becomes_active(cli, tmp_path: Path) -> None:
    first = write_set(tmp_path / "calm.json")
    cli("workspace", "import-pairs", first)
    cli("workspace", "import-pairs", write_set(tmp_path / "other.json", "other"))
    assert index()["active"] == "other"
    reformatted = write_set(tmp_path / "again.json", indent=4)  # other bytes, same canonical content
    copy = workspace_root() / "pairs" / "calm.json"
    before = copy.stat().st_mtime_ns
    run = cli("workspace", "import-pairs", reformatted, "--name", "another")
    assert run.code == 0, run.err
    assert run.json["status"] == "unchanged" and run.json["id"] == "calm" and run.json["active"] == "calm"
    assert "nothing was copied" in run.json["reason"]
    assert index()["active"] == "calm" and [e["id"] for e in index()["entries"]] == ["calm", "other"]
    assert not (workspace_root() / "pairs" / "another.json").exists() and copy.stat().st_mtime_ns == before
    assert cli("workspace", "import-pairs", first).json["status"] == "unchanged"


def test_conflicting_never_overwrites_and_names_the_existing_copy(cli, tmp_path: Path) -> None:
    cli("workspace", "import-pairs", write_set(tmp_path / "a" / "calm.json"))
    copy = workspace_root() / "pairs" / "calm.json"
    before_copy, before_index = copy.read_bytes(), (workspace_root() / "index.json").read_bytes()
    run = cli("workspace", "import-pairs", write_set(tmp_path / "b" / "calm.json", count=3))
    assert run.code == 1 and run.out == ""
    assert run.err.strip() == (
        f'error: conflicting: the workspace already keeps a different pair set as "calm" '
        f"({copy}), which is never overwritten; import under another --name, or first "
        f"run ster workspace remove calm"
    )
    assert copy.read_bytes() == before_copy and (workspace_root() / "index.json").read_bytes() == before_index
    events = cli("--json", "workspace", "import-pairs", tmp_path / "b" / "calm.json").events
    assert events[-1]["details"] == {"status": "conflicting", "id": "calm", "existing": str(copy)}


@pytest.mark.parametrize(
    ("document", "sentence"),
    [
        ('{"trait_name": "calm", "pairs": []}', "contains no pairs"),
        (
            '{"trait_name": "calm", "pairs": [{"positive": "a", "negative": " "}]}',
            "contains an empty positive or negative prompt",
        ),
        ('{"trait_name": "calm"}', "is not in the expected shape: pairs: Field required"),
        ("{", "is not valid JSON"),
    ],
)
def test_an_invalid_file_is_rejected_with_the_pair_set_sentence_and_nothing_written(
    cli, tmp_path: Path, document: str, sentence: str
) -> None:
    source = tmp_path / "bad.json"
    source.write_text(document)
    run = cli("workspace", "import-pairs", source)
    assert run.code == 1 and run.out == ""
    assert run.err.strip().startswith(f"error: pair set {source} ") and sentence in run.err
    assert files_under(workspace_root()) == [] and files_under(tmp_path / "state") == []


def test_a_missing_source_and_bad_ids_are_refused(cli, tmp_path: Path) -> None:
    missing = cli("workspace", "import-pairs", tmp_path / "nope.json")
    assert missing.code == 1 and f"pair set {tmp_path / 'nope.json'} does not exist" in missing.err
    source = write_set(tmp_path / "My Pairs.json")
    from_file = cli("workspace", "import-pairs", source)
    assert from_file.code == 1 and "the file name My Pairs.json does not make a valid set id" in from_file.err
    assert "give one with --name" in from_file.err
    blank = cli("workspace", "import-pairs", source, "--name", "")  # a blank value means none: the file name is used
    assert blank.code == 1 and "the file name My Pairs.json does not make a valid set id" in blank.err
    for bad in ("../escape", ".hidden", "UPPER", "a/b", "x" * 65):
        run = cli("workspace", "import-pairs", source, "--name", bad)
        assert run.code == 1 and f'--name "{bad}" is not a valid set id' in run.err, bad
    assert files_under(workspace_root()) == []


def test_show_lists_sets_the_active_one_and_missing_copies(cli, tmp_path: Path) -> None:
    empty = cli("workspace", "show")
    assert empty.code == 0 and empty.json == {"root": str(workspace_root()), "active": None, "sets": []}
    assert not workspace_root().exists()  # showing creates nothing
    cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    cli("workspace", "import-pairs", write_set(tmp_path / "bold.json", "bold", 3))
    (workspace_root() / "pairs" / "calm.json").unlink()
    shown = cli("workspace", "show").json
    assert shown["active"] == "bold"
    assert [(s["id"], s["active"], s["present"], s["pair_count"]) for s in shown["sets"]] == [
        ("calm", False, False, 2),
        ("bold", True, True, 3),
    ]
    assert shown["sets"][1]["path"] == str(workspace_root() / "pairs" / "bold.json")


def test_select_activates_and_refuses_unknown_ids_naming_the_known_ones(cli, tmp_path: Path) -> None:
    none_yet = cli("workspace", "select", "calm")
    assert none_yet.code == 1 and "the workspace holds none yet" in none_yet.err
    assert not workspace_root().exists()
    cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    cli("workspace", "import-pairs", write_set(tmp_path / "bold.json", "bold"))
    run = cli("workspace", "select", "calm")
    assert run.code == 0 and run.json == {
        "active": "calm",
        "path": str(workspace_root() / "pairs" / "calm.json"),
        "previous": "bold",
    }
    assert active_pairs() == workspace_root() / "pairs" / "calm.json"
    unknown = cli("workspace", "select", "shy")
    assert unknown.code == 1
    assert unknown.err.strip() == 'error: no pair set "shy" in the workspace; the known sets are "calm", "bold"'
    (workspace_root() / "pairs" / "bold.json").unlink()
    gone = cli("workspace", "select", "bold")
    assert gone.code == 1 and "has lost its copy" in gone.err and index()["active"] == "calm"


def test_remove_deletes_the_copy_and_the_entry(cli, tmp_path: Path) -> None:
    cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    cli("workspace", "import-pairs", write_set(tmp_path / "bold.json", "bold"))
    other = cli("workspace", "remove", "calm")
    assert other.code == 0 and other.json == {
        "removed": "calm",
        "path": str(workspace_root() / "pairs" / "calm.json"),
        "copy_deleted": True,
        "active": "bold",
    }
    assert not (workspace_root() / "pairs" / "calm.json").exists() and index()["active"] == "bold"
    active = cli("workspace", "remove", "bold")
    assert active.code == 0 and active.json["active"] is None and "no pair set is active now" in active.err
    assert index() == {"schema_version": 1, "active": None, "entries": []}
    unknown = cli("workspace", "remove", "bold")
    assert unknown.code == 1 and 'no pair set "bold" in the workspace' in unknown.err
    again = cli("workspace", "import-pairs", tmp_path / "calm.json")  # a removed id is free again
    assert again.json["status"] == "imported"


def test_active_pairs_refuses_when_none_is_active_or_its_copy_is_gone(tmp_path: Path) -> None:
    with pytest.raises(
        Refusal,
        match=r"^no pair set is active in the workspace; give --pairs FILE, or import one "
        r"with ster workspace import-pairs FILE$",
    ):
        active_pairs()
    outcome = import_pair_set(write_set(tmp_path / "calm.json"), None)
    assert outcome.status == "imported" and active_pairs() == Path(outcome.path)
    Path(outcome.path).unlink()
    with pytest.raises(Refusal, match='the active pair set "calm" has lost its copy'):
        active_pairs()
    restored = import_pair_set(tmp_path / "calm.json", None)  # importing the content again restores the copy
    assert restored.status == "imported" and active_pairs() == Path(outcome.path)


def test_a_damaged_index_is_refused_and_left_alone(cli, tmp_path: Path) -> None:
    workspace_root().mkdir(parents=True)
    (workspace_root() / "index.json").write_text("{")
    run = cli("workspace", "import-pairs", write_set(tmp_path / "calm.json"))
    assert run.code == 1 and "workspace index" in run.err and "is not valid JSON" in run.err
    assert (workspace_root() / "index.json").read_text() == "{"
    (workspace_root() / "index.json").write_text('{"schema_version": 9, "active": null, "entries": []}')
    assert "schema_version 9 is not one this Ster reads" in cli("workspace", "show").err


def test_train_without_pairs_uses_the_active_set(cli, tmp_path: Path) -> None:
    output = tmp_path / "calm.json"
    refused = cli("train", "--model", "ster:toy", "--output", output)
    assert refused.code == 1 and not output.exists()
    assert refused.err.strip().endswith(
        "error: no pair set is active in the workspace; give --pairs FILE, or import "
        "one with ster workspace import-pairs FILE"
    )
    assert cli("workspace", "import-pairs", EXAMPLE_PAIRS, "--name", "calm").code == 0
    run = cli("train", "--model", "ster:toy", "--output", output, "--layers", "1,2")
    assert run.code == 0, run.err
    assert run.json["trait_name"] == "calm" and output.is_file()
    assert [layer["layer"] for layer in run.json["layers"]] == [1, 2]


def _import_many(barrier, names: list[str], sources: list[str]) -> None:
    """A racing process: wait for the others, then import its sets one after another."""
    barrier.wait()
    for name, source in zip(names, sources):
        import_pair_set(Path(source), name)


def test_concurrent_imports_in_separate_processes_lose_no_entry(tmp_path: Path) -> None:
    processes, rounds = 4, 6
    jobs = []
    for p in range(processes):
        names = [f"p{p}-r{r}" for r in range(rounds)]
        jobs.append((names, [str(write_set(tmp_path / f"{n}.json", n)) for n in names]))
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    workers = [context.Process(target=_import_many, args=(barrier, *job)) for job in jobs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * processes
    entries = index()["entries"]
    assert sorted(e["id"] for e in entries) == sorted(n for names, _ in jobs for n in names)
    assert index()["active"] in {e["id"] for e in entries}
    for entry in entries:
        assert json.loads((workspace_root() / entry["file"]).read_text())["trait_name"] == entry["id"]
    assert not list(workspace_root().rglob("*.tmp"))


def test_concurrent_cli_imports_lose_no_entry(tmp_path: Path) -> None:
    """The same race through ``python -m ster workspace import-pairs``, two rounds of three processes."""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state")}
    names = []
    for r in range(2):
        batch = [write_set(tmp_path / f"cli{r}-{p}.json", f"cli{r}-{p}") for p in range(3)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "ster", "workspace", "import-pairs", str(s)],
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=REPO,
            )
            for s in batch
        ]
        assert [proc.wait(120) for proc in procs] == [0, 0, 0]
        names += [s.stem for s in batch]
    assert sorted(e["id"] for e in index()["entries"]) == sorted(names)


def test_workspace_show_leaves_torch_unimported(tmp_path: Path) -> None:
    code = (
        "import sys; from ster.cli import main; code = main(['workspace', 'show']); "
        "heavy = [m for m in ('torch', 'transformers', 'textual') if m in sys.modules]; "
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(code)"
    )
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr
    assert json.loads(proc.stdout)["sets"] == []
    assert run_subprocess("workspace", "show", env=env).code == 0
