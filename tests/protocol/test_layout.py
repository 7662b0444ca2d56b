"""The engine's layout: five parts with one direction of dependency, and no import cycles.

Every import is counted, including those inside functions and under TYPE_CHECKING,
because a lazy import is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "ster" / "engine"
PARTS = ["protocol", "model", "pairs", "steering", "tune", "serving"]
"""In dependency order: each part may import only the parts before it."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ENGINE.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ster.engine"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("ster.engine"))
        graph[_module_name(path)] = found
    return graph


def _part(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 3 else None


def test_every_engine_module_lives_in_a_part() -> None:
    loose = [
        name
        for name in _imports()
        if name != "ster.engine" and _part(name) not in PARTS and name.split(".")[-1] not in PARTS
    ]
    assert loose == []


def test_parts_depend_only_on_the_parts_before_them() -> None:
    wrong = []
    for module, imported in _imports().items():
        here = _part(module) or module.split(".")[-1]
        for target in imported:
            there = _part(target) or target.split(".")[-1]
            if there in PARTS and here in PARTS and PARTS.index(there) > PARTS.index(here):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_module_import_cycle() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(trail[trail.index(target) :] + [target])
            elif target in graph and not state.get(target):
                visit(target, trail + [target])
        state[module] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])
    assert cycles == []


def test_no_module_imports_another_modules_private_names() -> None:
    """A leading underscore says "only this module relies on it": a name another module needs is made public."""
    package = ENGINE.parent
    taken = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ster"):
                taken += [
                    f"{path.relative_to(package.parent)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert taken == []
