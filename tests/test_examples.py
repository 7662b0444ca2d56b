"""The bundled examples by their reserved names, and the commands the README and the walkthrough print.

Every command here runs as a real ``python -m ster`` process in a temporary directory outside
the checkout, as a new user would run it: the names must not depend on the current directory.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ster.engine.pairs.onboarding import SCREENS
from ster.engine.protocol.paths import EXAMPLES, EXAMPLES_DIR
from tests.conftest import REPO, CliRun


def ster(*args: str, cwd: Path) -> CliRun:
    proc = subprocess.run(
        [sys.executable, "-m", "ster", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=os.environ.copy(),
        timeout=300,
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


def ster_parts(command_line: str) -> list[list[str]]:
    """The ``ster ...`` commands of a shell line joined by ``&&``, as argument lists without ``ster``."""
    commands = [shlex.split(part) for part in command_line.split("&&")]
    return [words[1:] for words in commands if words and words[0] == "ster"]


def quick_start() -> tuple[str, str]:
    """The README's quick-start paragraph and its first command line."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    paragraph, block = section.split("```bash\n", 1)
    return paragraph, block.split("\n```", 1)[0].strip()


def test_every_reserved_name_is_a_bundled_file() -> None:
    assert all((EXAMPLES_DIR / file).is_file() for file in EXAMPLES.values())
    assert sorted(EXAMPLES) == [
        "ster:chat-examples",
        "ster:examples",
        "ster:grpo-prompts",
        "ster:neutral",
        "ster:pairs",
        "ster:prompts",
    ]


def test_the_readme_quick_start_runs_verbatim_outside_the_checkout(tmp_path: Path) -> None:
    paragraph, line = quick_start()
    commands = ster_parts(line)
    assert [c[0] for c in commands] == ["optimize", "generate"]
    runs = [ster(*command, cwd=tmp_path) for command in commands]
    assert [r.code for r in runs] == [0, 0], [r.err for r in runs]
    artifact = tmp_path / "runs" / "calm.ster.json"
    assert json.loads(artifact.read_text())["trait_name"] == "calm"
    assert f"`{runs[1].json['text']}`" in paragraph, "the paragraph quotes what the command prints"


def test_the_quick_start_output_is_ignored_by_git_in_a_checkout() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    _, line = quick_start()
    outputs = [c[c.index("--output") + 1] for c in ster_parts(line) if "--output" in c]
    assert outputs == ["runs/calm.ster.json"]
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", outputs[0]])
    assert ignored.returncode == 0, f"{outputs[0]} would show up as an untracked file"


def test_the_walkthrough_toy_commands_run_verbatim_outside_the_checkout(tmp_path: Path) -> None:
    screen = next(s for s in SCREENS if s.title == "Try the toy model")
    lines = [line.strip() for line in screen.body.splitlines() if line.strip().startswith("ster ")]
    assert len(lines) == 2
    for line in lines:
        run = ster(*shlex.split(line)[1:], cwd=tmp_path)
        assert run.code == 0, run.err


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (["pairs", "inspect", "--pairs", "ster:pairs"], lambda d: d["pair_count"] == 12 and d["trait_name"] == "calm"),
        (
            ["extract", "--model", "ster:toy", "--input", "ster:prompts", "--output", "states.json", "--layers", "0"],
            lambda d: d["prompts"] == len(json.loads((EXAMPLES_DIR / "prompts.json").read_text())["prompts"]),
        ),
        (["workspace", "import-pairs", "ster:pairs"], lambda d: d["id"] == "pairs" and d["pair_count"] == 12),
        (
            ["onboarding", "--import-pairs", "ster:pairs", "--name", "calm"],
            lambda d: d["status"] == "complete" and d["imported"]["id"] == "calm",
        ),
    ],
)
def test_input_flags_take_the_reserved_names_from_any_directory(tmp_path: Path, args: list[str], check) -> None:
    run = ster(*args, cwd=tmp_path)
    assert run.code == 0, run.err
    assert check(run.json)


def test_sweep_reads_the_bundled_prompts(tmp_path: Path) -> None:
    assert (
        ster(
            "train",
            "--model",
            "ster:toy",
            "--pairs",
            "ster:pairs",
            "--output",
            "calm.json",
            "--layers",
            "3",
            cwd=tmp_path,
        ).code
        == 0
    )
    run = ster(
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        "calm.json",
        "--prompts",
        "ster:prompts",
        "--strengths=3",
        "--max-new-tokens",
        "4",
        cwd=tmp_path,
    )
    assert run.code == 0, run.err


def test_an_unknown_reserved_name_is_refused_listing_the_names(tmp_path: Path) -> None:
    run = ster("pairs", "inspect", "--pairs", "ster:pair", cwd=tmp_path)
    assert run.code == 1
    assert run.err.strip() == (
        "error: --pairs ster:pair is not a bundled example; the bundled examples are " + ", ".join(EXAMPLES)
    )


def test_the_readme_ablation_and_bake_commands_run_verbatim_after_the_quick_start(tmp_path: Path) -> None:
    _, line = quick_start()
    assert ster(*ster_parts(line)[0], cwd=tmp_path).code == 0  # the direction the section uses
    text = (REPO / "README.md").read_text()
    block = text.split("## Ablating, and directions for other engines", 1)[1].split("```bash\n", 1)[1]
    lines = [shlex.split(row) for row in block.split("\n```", 1)[0].splitlines()]
    assert [words[1:3] for words in lines] == [["generate", "--model"], ["bake", "--model"], ["bake", "--model"]]
    runs = [ster(*words[1:], cwd=tmp_path) for words in lines]
    assert [r.code for r in runs] == [0, 0, 0], [r.err for r in runs]
    assert runs[0].json["mode"] == "ablate" and runs[0].json["edits"]["embedding"]["weight"] == 1.0
    assert (tmp_path / "runs" / "calm-ablated" / "model.safetensors").is_file()
    assert (tmp_path / "runs" / "calm.gguf").read_bytes()[:4] == b"GGUF"
