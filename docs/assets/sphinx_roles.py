"""A griffe extension for the docs: Sphinx roles in docstrings as mkdocstrings cross-references.

Ster's docstrings name other objects as Sphinx does (``:class:`SterError```, ``:func:`~ster.api.steer```), which
Markdown would show as the literal text ``:class:`` before the name. This rewrites each role, before mkdocstrings
renders it, into a link (``[`SterError`][ster.api.SterError]``) where the name resolves, from the docstring's own
scope outwards, to an object under one of ``linked`` (the modules the site documents), and into plain code
(``SterError``) otherwise, so that a name outside the site is never a broken cross-reference.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([\w.]+)`")


class SphinxRoles(griffe.Extension):
    def __init__(self, linked: list[str] | None = None) -> None:
        super().__init__()
        self.linked = tuple(linked or [])

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg, set()):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(partial(self._link, obj), obj.docstring.value)

    def _link(self, obj: griffe.Object, match: re.Match[str]) -> str:
        short, name = match.group(1) == "~", match.group(2)
        shown = name.rsplit(".", 1)[-1] if short else name
        target = _resolved(obj, name)
        if target is None or not target.startswith(self.linked):
            return f"`{shown}`"
        return f"[`{shown}`][{target}]"


def _walk(obj: griffe.Object, seen: set[str]) -> Any:
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member, seen)


def _resolved(obj: griffe.Object, name: str) -> str | None:
    """The dotted path ``name`` stands for from ``obj``'s scope: its own members, its parents', or an absolute path."""
    first = name.split(".", 1)[0]
    scope: griffe.Object | None = obj
    while scope is not None:
        if first in scope.members:
            return f"{scope.path}.{name}"
        scope = scope.parent
    root = obj.package
    if first == root.name:
        return name
    return None
