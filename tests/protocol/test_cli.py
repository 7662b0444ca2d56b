"""The command line itself: help without torch, exit codes, the engine/TUI boundary."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO, run_subprocess

IMPORT_CHECK = """
import sys
from ster.cli import main
try:
    main({args!r})
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "safetensors", "textual") if m in sys.modules)
print("HEAVY", heavy)
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["generate", "--help"], ["extract", "--help"], ["model", "import", "--help"], []]
)
def test_help_imports_no_torch(args: list[str]) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK.format(args=args)], capture_output=True, text=True, cwd=REPO
    )
    assert "usage: ster" in proc.stdout
    assert "HEAVY []" in proc.stdout


def test_engine_never_imports_the_tui() -> None:
    for path in (REPO / "ster" / "engine").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("ster.tui", "textual")), f"{path} imports {name}"


def test_usage_error_exits_2(cli) -> None:
    run = cli("generate", "--model", "ster:toy")  # --prompt missing
    assert run.code == 2
    assert "--prompt" in run.err


def test_invalid_value_is_refused_with_one_sentence(cli) -> None:
    run = cli("generate", "--model", "ster:toy", "--prompt", "the sea is", "--max-new-tokens", "0")
    assert run.code == 1
    assert run.err.strip() == "error: --max-new-tokens must be at least 1"
    assert run.out == ""


def test_python_dash_m_runs(tmp_path: Path) -> None:
    run = run_subprocess("--version")
    assert run.code == 0 and run.out.startswith("ster ")


def test_json_mode_ends_with_the_error_event(cli) -> None:
    run = cli("--json", "generate", "--model", "no/such-dir/", "--prompt", "x")
    assert run.code == 1
    events = run.events
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "refused"
    assert "does not exist" in events[-1]["message"]
    assert "Traceback" not in run.err


def _commands(parser, path=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _commands(sub, (*path, name))


def test_every_help_text_renders(cli) -> None:
    from ster.commands import build_parser

    commands = list(_commands(build_parser()))
    assert len(commands) > 20
    for command in commands:
        run = cli(*command, "--help")
        assert run.code == 0 and run.out.startswith(f"usage: ster {' '.join(command)}"), command
        assert "%%" not in run.out and "%(" not in run.out, command


def test_the_help_says_what_exists(cli) -> None:
    top = " ".join(cli("--help").out.split())
    assert "LoRA adapters" in top and "steer generation" in top
    optimize = " ".join(cli("optimize", "--help").out.split())
    assert "on the first 80% of the pairs" in optimize
