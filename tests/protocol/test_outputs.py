"""Every job that writes refuses, before it runs, an output that would destroy an input or another kind of file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.engine.protocol.jobs import JOBS, request_class
from ster.engine.protocol.paths import is_path_field

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPTS = EXAMPLES_DIR / "prompts.json"


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    return Path(shutil.copy(PAIRS, tmp_path / "pairs.json"))


def _refused_before_running(run, path: Path, before: bytes, *flags: str) -> None:
    assert run.code == 1, run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, "refused before any progress: nothing but the one sentence"
    for flag in flags:
        assert flag in lines[0]
    assert path.read_bytes() == before


@pytest.mark.parametrize("job", ["train", "optimize", "vector train"])
def test_an_artifact_over_its_own_pair_set_is_refused(cli, pairs: Path, job: str) -> None:
    before = pairs.read_bytes()
    run = cli(*job.split(), "--model", "ster:toy", "--pairs", pairs, "--output", pairs)
    _refused_before_running(run, pairs, before, "--output", "--pairs")
    assert run.err.strip() == (
        f"error: --output {pairs} is the same file as --pairs {pairs}, so writing it would "
        "destroy the input; give --output another path"
    )


def test_extract_over_its_own_input_is_refused(cli, tmp_path: Path) -> None:
    prompts = Path(shutil.copy(PROMPTS, tmp_path / "prompts.json"))
    before = prompts.read_bytes()
    run = cli("extract", "--model", "ster:toy", "--input", prompts, "--output", prompts)
    _refused_before_running(run, prompts, before, "--output", "--input")


@pytest.mark.parametrize("spelling", ["symlink", "hardlink", "dotted", "relative"])
def test_the_same_file_under_another_name_is_refused(
    cli, pairs: Path, spelling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = pairs.parent / "other.json"
    if spelling == "symlink":
        other.symlink_to(pairs.name)
    elif spelling == "hardlink":
        os.link(pairs, other)
    elif spelling == "dotted":
        (pairs.parent / "sub").mkdir()
        other = pairs.parent / "sub" / ".." / pairs.name
    else:
        monkeypatch.chdir(pairs.parent)
        other = Path(pairs.name)
    before = pairs.read_bytes()
    run = cli("train", "--model", "ster:toy", "--pairs", pairs, "--output", other)
    _refused_before_running(run, pairs, before, "--output", "--pairs")


def test_model_import_over_its_own_gguf_is_refused(cli, tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF not really")
    run = cli("model", "import", gguf, "--output", gguf)
    _refused_before_running(run, gguf, b"GGUF not really", "--output", "FILE.gguf")


def test_every_job_that_writes_declares_its_outputs() -> None:
    """The rule the check rests on: each path field a job writes is listed in ``outputs``."""
    writers = {
        name: request_class(name).outputs
        for name in JOBS
        if any(f in request_class(name).model_fields for f in request_class(name).outputs)
    }
    assert writers == {
        "extract": ("output",),
        "train": ("output",),
        "optimize": ("output",),
        "calibrate": ("output",),
        "pairs add": ("pairs",),
        "pairs remove": ("pairs",),
        "pairs save": ("pairs",),
        "pairs synthesize": ("output",),
        "model import": ("output",),
        "tune sft": ("output",),
        "tune dpo": ("output",),
        "tune reward": ("output",),
        "tune grpo": ("output",),
        "tune merge": ("output",),
        "tune export-peft": ("output",),
        "bake": ("output",),
        "vector import": ("output",),
    }
    for name in writers:
        fields = request_class(name).model_fields
        assert all(is_path_field(fields[out].annotation) for out in writers[name])


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "ster:pairs"], "--output"),
        (["extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", "ster:prompts"], "--output"),
        (
            ["pairs", "synthesize", "--trait", "calm", "--count", "1", "--model", "ster:toy", "--output", "ster:pairs"],
            "--output",
        ),
        (["pairs", "add", "--pairs", "ster:pairs", "--positive", "a", "--negative", "b"], "--pairs"),
        (["pairs", "remove", "--pairs", "ster:pairs", "--index", "0"], "--pairs"),
        (["model", "import", "x.gguf", "--output", "ster:toy"], "--output"),
    ],
)
def test_a_bundled_name_is_never_an_output(cli, args: list[str], flag: str) -> None:
    before = PAIRS.read_bytes()
    run = cli(*args)
    assert run.code == 1
    assert run.err.strip().startswith(f"error: {flag} ster:")
    assert "is read-only" in run.err
    assert PAIRS.read_bytes() == before


@pytest.mark.parametrize("target", [PAIRS, TOY_DIR / "config.json", TOY_DIR / "new.json"])
def test_a_path_inside_the_bundled_data_is_never_an_output(cli, target: Path) -> None:
    run = cli("optimize", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", target)
    assert run.code == 1 and "is inside Ster's bundled data, which is read-only" in run.err
    assert not (TOY_DIR / "new.json").exists()


def test_an_artifact_replaces_an_older_artifact_and_says_so(cli, tmp_path: Path) -> None:
    out = tmp_path / "calm.json"
    first = cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", out, "--layers", "1")
    assert first.code == 0, first.err
    out.chmod(0o640)
    run = cli("--json", "train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", out, "--layers", "3")
    assert run.code == 0
    logs = [e["message"] for e in run.events if e["type"] == "log"]
    assert logs.count(f"replacing the steering artifact at {out}") == 1
    assert [v["layer"] for v in json.loads(out.read_text())["vectors"]] == [3]
    assert out.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("job", "existing", "holds"),
    [
        (["train", "--pairs", "ster:pairs"], PAIRS, "a pair set"),
        (["optimize", "--pairs", "ster:pairs"], PROMPTS, "a prompt set"),
        (["extract", "--input", "ster:prompts"], PAIRS, "a pair set"),
        (["train", "--pairs", "ster:pairs"], None, "a file that is not a Ster document"),
    ],
)
def test_another_kind_of_file_is_never_replaced(
    cli, tmp_path: Path, job: list[str], existing: Path | None, holds: str
) -> None:
    out = tmp_path / "out.json"
    if existing is None:
        out.write_text("my notes\n")
    else:
        shutil.copy(existing, out)
    before = out.read_bytes()
    run = cli(*job, "--model", "ster:toy", "--output", out)
    assert run.code == 1 and f"already holds {holds}" in run.err and "loading" not in run.err
    assert out.read_bytes() == before


def test_extract_over_an_older_activation_document_is_allowed(cli, tmp_path: Path) -> None:
    out = tmp_path / "states.json"
    assert cli("extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", out).code == 0
    run = cli("extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", out, "--layers", "0")
    assert run.code == 0 and f"replacing the activation document at {out}" in run.err
    assert list(json.loads(out.read_text())["records"][0]["layers"]) == ["0"]


def test_an_output_under_a_directory_that_cannot_hold_a_file_is_refused(cli) -> None:
    run = cli("extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", "/proc/x.json")
    assert run.code == 1
    assert run.err.strip().startswith("error: output /proc/x.json cannot be written: /proc cannot hold a new file")
    add = cli("pairs", "add", "--pairs", "/proc/x.json", "--positive", "a", "--negative", "b")
    assert add.code == 1 and len(add.err.strip().splitlines()) == 1


def test_a_fifo_output_is_refused_without_blocking(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    run = cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", fifo)
    assert run.code == 1 and f"output {fifo} is a FIFO, not a regular file" in run.err
    add = cli("pairs", "add", "--pairs", fifo, "--positive", "a", "--negative", "b")
    assert add.code == 1 and "is a FIFO" in add.err


def test_the_editor_save_never_replaces_an_artifact(cli, tmp_path: Path) -> None:
    from ster.engine.pairs.model import PairSet
    from ster.engine.protocol.events import Error
    from ster.engine.protocol.jobs import build_job_request, run_job

    artifact = tmp_path / "calm.json"
    assert cli("train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", artifact).code == 0
    before = artifact.read_bytes()
    request = build_job_request("pairs save", pairs=artifact, pair_set=PairSet.model_validate_json(PAIRS.read_text()))
    final = run_job("pairs save", request, lambda event: None)
    assert isinstance(final, Error) and "already holds a steering artifact" in final.message
    assert artifact.read_bytes() == before


def test_the_active_sets_copy_is_never_replaced_by_an_artifact(cli) -> None:
    imported = cli("workspace", "import-pairs", "ster:pairs")
    assert imported.code == 0, imported.err
    copy = Path(imported.json["path"])
    before = copy.read_bytes()
    run = cli("train", "--model", "ster:toy", "--output", copy)
    assert run.code == 1 and f"output {copy} already holds a pair set" in run.err
    assert copy.read_bytes() == before
