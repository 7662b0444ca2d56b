"""A bad input is refused before torch is imported, so the refusal comes in a fraction of a second.

Each command runs in a fresh interpreter with a bad input and reports whether torch ended
up in ``sys.modules``; importing torch takes seconds, checking a file does not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PROBE = (
    "import sys; from ster.cli import main; code = main(sys.argv[1:]); "
    "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
)
PROMPT = "question : tell me about the town . answer :"


def _refusal(*args: str) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    return proc.returncode, proc.stderr.splitlines()


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--model", "ster:toy", "--pairs", "{tmp}/missing.json", "--output", "{tmp}/a.json"],
        ["optimize", "--model", "ster:toy", "--pairs", "{tmp}/missing.json", "--output", "{tmp}/a.json"],
        ["optimize", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "{tmp}/a.json", "--layers", "9"],
        ["evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--vector", "{tmp}/missing.json"],
        ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", "{tmp}/missing.json"],
        ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "500"],
        ["sweep", "--model", "ster:toy", "--vector", "{tmp}/missing.json", "--prompts", "ster:prompts"],
        ["extract", "--model", "ster:toy", "--input", "{tmp}/missing.json", "--output", "{tmp}/a.json"],
        ["train", "--model", "{tmp}/no-model", "--pairs", "ster:pairs", "--output", "{tmp}/a.json"],
        ["tune", "sft", "--model", "ster:toy", "--examples", "{tmp}/missing.json", "--output", "{tmp}/a.safetensors"],
        [
            "tune",
            "dpo",
            "--model",
            "ster:toy",
            "--pairs",
            "ster:pairs",
            "--output",
            "{tmp}/a.safetensors",
            "--layers",
            "9",
        ],
        [
            "tune",
            "dpo",
            "--model",
            "ster:toy",
            "--pairs",
            "ster:pairs",
            "--output",
            "{tmp}/a.safetensors",
            "--max-sequence",
            "3",
        ],
        ["tune", "reward", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "{tmp}"],
        ["tune", "dpo", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", "{tmp}/a.safetensors", "--resume"],
    ],
)
def test_a_bad_input_is_refused_before_torch_is_imported(tmp_path: Path, args: list[str]) -> None:
    code, lines = _refusal(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 1 and lines[-2].startswith("error: ") and lines[-1] == "False", lines
    assert list(tmp_path.iterdir()) == []


def test_a_good_run_does_import_torch(tmp_path: Path) -> None:
    """The probe itself can tell: a run that reaches the model has torch loaded."""
    code, lines = _refusal("generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "2")
    assert code == 0 and lines[-1] == "True", lines
