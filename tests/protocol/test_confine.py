"""The walk that keeps a confined job's paths inside its root, tried the way an attacker would.

Each case builds a root with links at every position a path has (the first component, one in the
middle, the last one, a link to a link), then checks that the walk refuses every way out before it
looks at anything outside, that it follows every link that stays inside, and that what it pins
cannot be redirected afterwards: a file read through its pin after a link was swapped is the file
that was there, and a write after its directory was swapped for a link lands where the pin was.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ster.engine.protocol import confine
from ster.engine.protocol.confine import Outside, Root
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import check_output_file, read_json, write_atomic

pytestmark = pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="POSIX paths")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Root, Path, Path]:
    """root/ with a sub directory and links in and out; outside/ beside it holding a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.json").write_text('{"secret": 1}')
    (root / "sub" / "f.json").write_text('{"pairs": []}')
    links = {
        "esc": outside,  # a relative name, an absolute target outside
        "esc-rel": Path("../outside"),  # a relative target that climbs out
        "sub/deep/up": Path("../../../outside"),
        "in": Path("sub"),  # stays inside
        "in-abs": root / "sub",  # absolute, inside
        "chain": Path("in"),  # a link to a link inside
        "chain-out": Path("esc"),  # a link to a link out
        "secret-link": outside / "secret.json",
        "missing-link": outside / "nothing.json",
        "loop": Path("loop"),
        "sub/back": Path(".."),  # the root, by a link
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    return Root(root), root, outside


INSIDE = [
    "sub",
    "sub/f.json",
    "in/f.json",
    "in-abs/f.json",
    "chain/f.json",
    "sub/back/sub/f.json",
    "in/../sub/f.json",
    "missing/../sub/f.json",
    "sub/deep/../f.json",
    ".",
    "",
]
OUTSIDE = [
    "esc/secret.json",
    "esc/nothing.json",
    "esc-rel/secret.json",
    "sub/deep/up/secret.json",
    "chain-out/x",
    "secret-link",
    "missing-link",
    "..",
    "../outside/secret.json",
    "sub/../../outside/secret.json",
    "missing/../../outside/secret.json",
    "sub/back/../outside",
    "in/../../outside",
]


@pytest.mark.parametrize("value", INSIDE)
def test_links_that_stay_inside_are_followed(tree, value: str) -> None:
    root, _, _ = tree
    assert root.check(value) is True


@pytest.mark.parametrize("value", OUTSIDE)
def test_every_way_out_is_refused_at_any_component(tree, value: str) -> None:
    root, _, _ = tree
    with pytest.raises(Outside, match=r"leads outside the server's root .*; name a path inside it"):
        root.check(value)


def test_absolute_paths_inside_and_outside(tree) -> None:
    root, path, outside = tree
    assert root.check(path / "sub" / "f.json") is True
    for value in (outside / "secret.json", "/etc/passwd", "/etc/no-such-file", str(path) + "x/f.json", "~/x"):
        with pytest.raises(Outside):
            root.check(value)


def test_a_sentence_never_depends_on_what_exists_outside(tree) -> None:
    """An existing and a missing target outside get the same sentence, apart from the path itself."""
    root, path, outside = tree
    (path / "to-missing").symlink_to(outside / "nope" / "nope.json")
    pairs = [
        ("/etc/passwd", "/etc/passwdx"),
        ("secret-link", "missing-link"),
        ("esc/secret.json", "esc/nope.json"),
        ("../outside/secret.json", "../outside/nope.json"),
        ("to-missing", "missing-link"),
    ]
    for present, absent in pairs:
        sentences = []
        for value in (present, absent):
            with pytest.raises(Outside) as caught:
                root.check(value)
            sentences.append(str(caught.value).replace(value, "PATH"))
        assert sentences[0] == sentences[1]


def test_a_loop_and_a_missing_path(tree) -> None:
    root, _, _ = tree
    with pytest.raises(Refusal, match="too many levels of symbolic links"):
        root.check("loop")
    assert root.check("nothing/here.json") is False
    assert root.check("sub/f.json/below") is False


def test_a_confined_read_is_pinned_against_a_swapped_link(tree) -> None:
    root, path, outside = tree
    (path / "doc.json").symlink_to("sub/f.json")
    with confine.within(root):
        pinned = confine.readable(path / "doc.json")
        (path / "doc.json").unlink()
        (path / "doc.json").symlink_to(outside / "secret.json")  # swapped after the pin
        assert read_json(path / "doc.json", "pair set") == {"pairs": []}
        assert pinned.read_text() == '{"pairs": []}'
    assert not pinned.exists() and not pinned.parent.parent.exists()  # the private pins are gone


def test_a_link_out_is_refused_when_opened_even_without_the_servers_check(tree) -> None:
    root, path, _ = tree
    with confine.within(root):
        for value in ("secret-link", "esc/secret.json", "chain-out/x"):
            with pytest.raises(Outside):
                read_json(path / value, "pair set")
            with pytest.raises(Outside):
                check_output_file(path / value)


def test_a_directory_read_through_its_pin_refuses_a_file_that_links_out(tree) -> None:
    root, path, outside = tree
    model = path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with confine.within(root):
        pinned = confine.readable(model)
        assert sorted(p.name for p in pinned.iterdir()) == ["config.json"]
    (model / "tokenizer.json").symlink_to(outside / "secret.json")
    with confine.within(root), pytest.raises(Outside, match="tokenizer.json leads outside"):
        confine.readable(model)


def test_a_write_lands_where_it_was_pinned_after_its_directory_is_swapped(tree) -> None:
    root, path, outside = tree
    (path / "runs").mkdir()
    with confine.within(root):
        check_output_file(path / "runs" / "calm.json")  # pins runs/ before the job's work
        (path / "runs").rename(path / "runs-moved")
        (path / "runs").symlink_to(outside)  # swapped while the job runs
        write_atomic(path / "runs" / "calm.json", '{"x": 1}\n')
    assert not (outside / "calm.json").exists()
    assert (path / "runs-moved" / "calm.json").read_text() == '{"x": 1}\n'


def test_a_write_replaces_a_link_that_appeared_after_its_pin_and_never_follows_it(tree) -> None:
    root, path, outside = tree
    with confine.within(root):
        check_output_file(path / "calm.json")
        (path / "calm.json").symlink_to(outside / "secret.json")
        write_atomic(path / "calm.json", '{"x": 1}\n')
    assert (outside / "secret.json").read_text() == '{"secret": 1}'
    assert not (path / "calm.json").is_symlink() and (path / "calm.json").read_text() == '{"x": 1}\n'


def test_missing_directories_are_made_at_the_write_and_never_through_a_link(tree) -> None:
    root, path, outside = tree
    with confine.within(root):
        check_output_file(path / "new" / "dir" / "calm.json")
        assert not (path / "new").exists()  # a check makes nothing
        write_atomic(path / "new" / "dir" / "calm.json", "{}\n")
    assert (path / "new" / "dir" / "calm.json").read_text() == "{}\n"
    with confine.within(root):
        check_output_file(path / "later" / "calm.json")
        (path / "later").symlink_to(outside)  # made by someone else between the check and the write
        with pytest.raises(Refusal):
            write_atomic(path / "later" / "calm.json", "{}\n")
    assert not (outside / "calm.json").exists()


def test_events_name_paths_as_given_never_as_pins(tree) -> None:
    from ster.engine.protocol.events import Log

    root, path, _ = tree
    with confine.within(root):
        pinned = confine.readable(path / "sub" / "f.json")
        shown = confine.shown(Log(message=f"could not read {pinned} or {pinned}x"))
    assert shown.message == f"could not read {path / 'sub' / 'f.json'} or {pinned}x"


def test_without_a_root_nothing_changes(tree) -> None:
    _, path, outside = tree
    assert confine.readable(path / "esc" / "secret.json") == path / "esc" / "secret.json"
    assert confine.writable(path / "secret-link", make=False) == outside / "secret.json"


def test_a_private_directory_a_killed_server_left_is_reclaimed_by_the_next_confined_job(
    tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    root, path, _ = tree
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    stale = scratch / ".ster-root.abcd1234.ster.tmp"
    (stale / "1").mkdir(parents=True)  # what a server killed mid-job leaves: nobody holds its lock
    (stale / "1" / "f.json").symlink_to("/proc/self/fd/9")
    with confine.within(root):
        pinned = confine.readable(path / "sub" / "f.json")
        assert not stale.exists()
        live = pinned.parent.parent
        assert live.parent == scratch and live.name.startswith(".ster-root.")
        with confine.within(root):  # another job at the same time leaves the live one alone
            confine.readable(path / "sub" / "f.json")
            assert live.exists()
    assert list(scratch.iterdir()) == []


def test_a_staging_directory_swapped_for_a_link_does_not_send_its_files_out(tree) -> None:
    from ster.engine.protocol.files import atomic_directory

    root, path, outside = tree
    with confine.within(root), atomic_directory(path / "merged") as staging:
        made = next(p for p in path.iterdir() if p.name.startswith(".merged."))
        made.rename(path / "moved-staging")
        made.symlink_to(outside)  # the staging directory swapped for a link out while it is written
        write_atomic(staging / "config.json", "{}\n")
        (staging / "model.safetensors").write_bytes(b"weights")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.json"]
    assert (path / "moved-staging" / "config.json").is_file()
