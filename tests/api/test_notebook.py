"""examples/steering.ipynb, run top to bottom in a real Jupyter kernel as a reader would run it.

The notebook is executed by nbclient in an ipykernel kernel of this very interpreter (a kernelspec of our own
whose argv is ``sys.executable``, so a ``python3`` kernelspec installed elsewhere on the machine cannot stand in
for it), in an empty working directory, with IPython's and Jupyter's own files kept in the test's temporary
directory. Every code cell must run without an error, and the printed results must say what the notebook's text
claims: the steered text differs from the unsteered one, ``ster.steer`` on the transformers model steers exactly
as Ster's own decoder does and leaves no hook behind, and calm sentences read higher along the direction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOK = REPO / "examples" / "steering.ipynb"
CELL_TIMEOUT = 180
"""Seconds one cell may take (the whole notebook takes a few seconds on two cores)."""
PROBE = "import json, os, sys\nprint(json.dumps({'executable': sys.executable, 'cwd': os.getcwd()}))"
"""A cell the test appends: which interpreter the kernel runs, and where."""


def kernel_manager(kernels: Path) -> AsyncKernelManager:
    """A manager that starts ``python3`` as this interpreter's ipykernel, whatever else is installed."""
    spec = kernels / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    manager = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)
    assert manager.kernel_spec.argv[0] == sys.executable
    return manager


def stream_text(cell: nbformat.NotebookNode) -> str:
    """What a code cell printed on stdout."""
    return "".join(out["text"] for out in cell.outputs if out["output_type"] == "stream" and out["name"] == "stdout")


def printed(cell: nbformat.NotebookNode, label: str) -> str:
    """The rest of the line the cell printed after ``label``."""
    for line in stream_text(cell).splitlines():
        if line.startswith(label):
            return line[len(label) :].strip()
    raise AssertionError(f"the cell printed no line starting {label!r}:\n{stream_text(cell)}")


def tagged(notebook: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    [cell] = [cell for cell in notebook.cells if tag in cell.get("metadata", {}).get("tags", [])]
    return cell


def test_the_notebook_is_stored_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert notebook.metadata["kernelspec"]["name"] == "python3"


def test_the_notebook_runs_in_a_kernel_of_this_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("MPLBACKEND", "agg")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))

    client = NotebookClient(
        notebook,
        km=kernel_manager(tmp_path / "kernels"),
        timeout=CELL_TIMEOUT,
        startup_timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, at the first cell that fails

    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    assert not [out for cell in code for out in cell.outputs if out["output_type"] == "error"]
    probe = json.loads(stream_text(code[-1]))
    assert probe == {"executable": sys.executable, "cwd": str(cwd)}
    assert list(cwd.iterdir()) == []  # the notebook wrote into its own temporary directory, and removed it

    generate = tagged(notebook, "generate")
    plain, steered = printed(generate, "unsteered:"), printed(generate, "steered:")
    assert plain and steered and plain != steered

    steer = tagged(notebook, "steer")
    assert printed(steer, "transformers, unsteered:") == plain
    assert printed(steer, "transformers, steered:") == steered
    assert printed(steer, "same text as Ster's own decoder:") == "True"
    assert printed(steer, "hooks removed after the block:") == "True"

    sweep = tagged(notebook, "sweep")
    assert len(stream_text(sweep).splitlines()) == 1 + 5  # the header, and the four strengths and 0

    assert printed(tagged(notebook, "read"), "calm above alarmed:") == "True"
