"""Reading and writing files: JSON input that is refused or accepted, and writes that keep what the user has."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol import files
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import (
    ACTIVATIONS,
    ARTIFACT,
    PAIR_SET,
    check_output_directory,
    check_output_file,
    read_json,
    write_atomic,
)
from ster.engine.protocol.kinds import describe_existing

ARTIFACT_DOC = {
    "schema_version": 1,
    "product": "ster",
    "model": "ster:toy",
    "model_revision": None,
    "trait_name": "calm",
    "method": "caa",
    "hidden_size": 2,
    "precision": "f32",
    "chat_template": "absent",
    "metadata": {},
    "vectors": [{"layer": 0, "vector": [1.0, 0.0]}],
}
ACTIVATIONS_DOC = {
    "schema_version": 1,
    "product": "ster",
    "model": "ster:toy",
    "model_revision": None,
    "hidden_size": 2,
    "precision": "f32",
    "chat_template": "absent",
    "records": [],
}
PAIRS_DOC = {"trait_name": "calm", "pairs": [{"positive": "a", "negative": "b"}]}


def _json(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document))
    return path


# --- reading ------------------------------------------------------------------------------------------


def test_a_duplicate_key_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"pairs": [{"positive": "a", "negative": "b", "positive": "c"}]}')
    with pytest.raises(Refusal, match='pair set .* gives the key "positive" twice in one object'):
        read_json(path, "pair set")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(PAIRS_DOC).encode())
    assert read_json(path, "pair set") == PAIRS_DOC


def test_deep_nesting_is_one_sentence_and_exit_1(cli, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    run = cli("pairs", "inspect", "--pairs", path)
    assert run.code == 1
    assert run.err.strip() == f"error: pair set {path} nests its arrays or objects too deeply to be read"


@pytest.mark.parametrize(
    "command",
    [["inspect", "{path}"], ["pairs", "inspect", "--pairs", "{path}"], ["workspace", "import-pairs", "{path}"]],
)
def test_every_reader_refuses_duplicate_keys(cli, tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "doubled.json"
    path.write_text('{"trait_name": "calm", "vectors": [], "pairs": [], "trait_name": "wild"}')
    run = cli(*[part.format(path=path) for part in command])
    assert run.code == 1 and 'gives the key "trait_name" twice' in run.err


def test_a_bom_pair_set_and_prompt_set_are_read(cli, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.json"
    pairs.write_bytes(b"\xef\xbb\xbf" + (EXAMPLES_DIR / "pairs.json").read_bytes())
    run = cli("pairs", "inspect", "--pairs", pairs)
    assert run.code == 0, run.err
    assert run.json["pair_count"] == 12


# --- what an output path holds ----------------------------------------------------------------------------


def test_describe_existing_names_what_a_path_holds(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "empty").write_text("")
    (tmp_path / "notes.txt").write_text("hello")
    os.mkfifo(tmp_path / "fifo")
    cases = {
        _json(tmp_path / "a.json", ARTIFACT_DOC): "a steering artifact",
        _json(tmp_path / "x.json", ACTIVATIONS_DOC): "an activation document",
        _json(tmp_path / "p.json", PAIRS_DOC): "a pair set",
        _json(tmp_path / "unnamed.json", {"pairs": []}): "a pair set",
        _json(tmp_path / "q.json", {"prompts": ["x"]}): "a prompt set",
        _json(
            tmp_path / "other.json", {"product": "other", "trait_name": "x", "vectors": []}
        ): "a file that is not a Ster document",
        tmp_path / "notes.txt": "a file that is not a Ster document",
        tmp_path / "empty": "an empty file",
        model: "a model directory",
        tmp_path / "empty-dir": "an empty directory",
        tmp_path / "fifo": "a FIFO",
        Path("/dev/null"): "a device",
        tmp_path / "absent.json": None,
    }
    assert {path: describe_existing(path) for path in cases} == cases


def test_describe_existing_follows_a_symlink(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(_json(tmp_path / "a.json", ARTIFACT_DOC))
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    assert describe_existing(link) == "a steering artifact"
    assert describe_existing(dangling) is None


def test_the_same_kind_is_replaced_with_one_log_line(tmp_path: Path) -> None:
    said: list[str] = []
    artifact = _json(tmp_path / "a.json", ARTIFACT_DOC)
    check_output_file(artifact, ARTIFACT, said.append)
    check_output_file(_json(tmp_path / "x.json", ACTIVATIONS_DOC), ACTIVATIONS, said.append)
    check_output_file(tmp_path / "new.json", ARTIFACT, said.append)
    assert said == [
        f"replacing the steering artifact at {artifact}",
        f"replacing the activation document at {tmp_path / 'x.json'}",
    ]


@pytest.mark.parametrize(
    ("document", "kind", "holds"),
    [
        (PAIRS_DOC, ARTIFACT, "a pair set"),
        (ARTIFACT_DOC, ACTIVATIONS, "a steering artifact"),
        (ACTIVATIONS_DOC, ARTIFACT, "an activation document"),
        (ARTIFACT_DOC, PAIR_SET, "a steering artifact"),
        ({"prompts": ["a"]}, ACTIVATIONS, "a prompt set"),
        ({"name": "not ster"}, ARTIFACT, "a file that is not a Ster document"),
    ],
)
def test_another_kind_is_refused(tmp_path: Path, document: dict, kind: str, holds: str) -> None:
    path = _json(tmp_path / "out.json", document)
    with pytest.raises(Refusal) as refused:
        check_output_file(path, kind)
    assert str(refused.value) == (
        f"output {path} already holds {holds}, which writing "
        f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} there would destroy; "
        "give another path"
    )


@pytest.mark.parametrize("make", ["fifo", "socket", "directory", "model directory"])
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path, make: str) -> None:
    path = tmp_path / "out.json"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    else:
        path.mkdir()
        if make == "model directory":
            (path / "config.json").write_text("{}")
    with pytest.raises(
        Refusal,
        match=r"^output .* is an? (FIFO|socket|empty directory|model directory), "
        "not a regular file; give a file path$",
    ):
        check_output_file(path, ARTIFACT)


def test_a_device_is_refused() -> None:
    with pytest.raises(Refusal, match="^output /dev/null is a device, not a regular file; give a file path$"):
        check_output_file(Path("/dev/null"))


def test_a_directory_that_cannot_hold_a_file_is_refused_before_the_write() -> None:
    with pytest.raises(Refusal, match=r"^output /proc/x.json cannot be written: /proc cannot hold a new file"):
        check_output_file(Path("/proc/x.json"))
    with pytest.raises(Refusal, match=r"^output /proc/a/b/x.json cannot be written: /proc cannot hold"):
        check_output_file(Path("/proc/a/b/x.json"))
    with pytest.raises(Refusal, match=r"^output directory /proc/model cannot be written: /proc cannot hold"):
        check_output_directory(Path("/proc/model"))


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    check_output_file(tmp_path / "sub" / "out.json", ARTIFACT)
    assert list(tmp_path.iterdir()) == []


def test_a_model_directory_or_file_is_not_an_import_destination(tmp_path: Path) -> None:
    artifact = _json(tmp_path / "a.json", ARTIFACT_DOC)
    with pytest.raises(Refusal, match="is a steering artifact, not a directory; give a new or empty directory"):
        check_output_directory(artifact)
    (tmp_path / "empty").mkdir()
    check_output_directory(tmp_path / "empty")


# --- the write itself ---------------------------------------------------------------------------------------


def test_a_write_through_a_symlink_replaces_its_target_and_keeps_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    target = real_dir / "artifact.json"
    target.write_text("old")
    link = link_dir / "artifact.json"
    link.symlink_to(os.path.relpath(target, link_dir))
    used: list[str] = []
    temp_file = files.inflight.temp_file
    monkeypatch.setattr(files.inflight, "temp_file", lambda **kw: used.append(kw["dir"]) or temp_file(**kw))
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == os.path.relpath(target, link_dir)
    assert target.read_text() == "new"
    assert used == [real_dir], "the temporary file lives beside the target, so the rename is atomic"
    assert sorted(p.name for p in real_dir.iterdir()) == ["artifact.json"] and list(link_dir.iterdir()) == [link]


def test_a_write_keeps_the_permission_bits_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "private.json"
    path.write_text("old")
    path.chmod(0o600)
    write_atomic(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "new"
    fresh = tmp_path / "fresh.json"
    write_atomic(fresh, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_is_a_refusal_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(Refusal, match=r"^/proc/x.json could not be written: "):
        write_atomic(Path("/proc/x.json"), "x")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Refusal, match="could not be written"):
        write_atomic(blocker / "out.json", "x")
    assert blocker.read_text() == "x"
