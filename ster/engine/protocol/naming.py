"""How the engine's sentences name a request's fields: as the command line spells them, or in a front end's words.

A refusal names the field it is about (``--max-new-tokens must be at least 1``). The CLI, ``ster --json``
and the server speak in flags, so that is the default. The terminal app labels its fields ("max tokens")
and runs its checks and its jobs under :func:`named`, so the same sentence is composed in the app's words
rather than rewritten after the fact. Every sentence that names a field spells it with :func:`flag`.

The names travel in a context variable, so each job's thread has its own and nothing else is told; a
thread starts without any, so a job run elsewhere speaks in flags. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

POSITIONAL = {"gguf": "FILE.gguf", "source": "SRC", "artifact": "ARTIFACT", "control_vector": "FILE"}
"""Path fields the CLI takes as positional arguments, named as its usage line names them."""

_NAMES: ContextVar[Mapping[str, str]] = ContextVar("ster_field_names", default=MappingProxyType({}))


def flag(field: str) -> str:
    """How a sentence names the request field ``field``: the front end's word for it under :func:`named`,
    else its command-line spelling (``max_new_tokens`` → ``--max-new-tokens``)."""
    try:
        return _NAMES.get()[field]  # a front end's mapping may answer for every field (a dict's __missing__)
    except KeyError:
        return POSITIONAL.get(field, "--" + field.replace("_", "-"))


def field_name(field: str) -> str:
    """How a sentence that names a field by its request name (the contract's ``max_sequence must be at least two
    tokens``) names it: that name, or the front end's word for it under :func:`named`."""
    try:
        return _NAMES.get()[field]
    except KeyError:
        return field


@contextmanager
def named(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block (in this thread or task), sentences name the fields in ``names`` by their values."""
    token = _NAMES.set(names)
    try:
        yield
    finally:
        _NAMES.reset(token)
