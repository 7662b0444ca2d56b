"""Every command and every flag that ``ster --help`` and each command's ``--help`` show is documented in docs/.

The commands and flags are read from the parser the CLI itself builds (``ster.commands.build_parser``, standard
library only, so nothing heavy is imported): a command or flag added to the tree without a word in the
documentation fails here, naming it. ``ster vector <command>`` repeats the steering commands under another name,
so its copies are checked to be exact copies rather than documented twice.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from ster.commands import build_parser
from tests.conftest import REPO

DOCS = REPO / "docs"
REFERENCE = DOCS / "commands.md"
Command = tuple[tuple[str, ...], argparse.ArgumentParser]
"""A command as its words after ``ster`` and its parser."""


def command_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    """Every command of the tree, the root ``ster`` first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_tree(sub, (*path, name))


def shown_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long flags a command's ``--help`` lists (those whose help is not suppressed)."""
    shown = [action for action in parser._actions if action.help != argparse.SUPPRESS]
    return sorted({option for action in shown for option in action.option_strings if option.startswith("--")})


TREE = list(command_tree(build_parser()))
TOP = {path for path, _ in TREE if path[:1] != ("vector",)}
COMMANDS = [(path, parser) for path, parser in TREE if path[:1] != ("vector",) or (path[1:] and path[1:] not in TOP)]
"""Every command, once: the top-level ones, and those only ``ster vector`` has (``ster vector import``)."""
ALIASES = [(path, parser) for path, parser in TREE if path[:1] == ("vector",) and path[1:] and path[1:] in TOP]
"""``ster vector <command>`` for each steering command, another name for ``ster <command>``."""


def name(path: tuple[str, ...]) -> str:
    return " ".join(("ster", *path))


def docs_text() -> str:
    return "\n".join(page.read_text() for page in sorted(DOCS.rglob("*.md")))


def mentions(text: str, words: str) -> bool:
    """``words`` in ``text`` as a whole token: ``--seed`` is not found in ``--seeds``, nor ``ster tune export`` in
    ``ster tune export-peft``."""
    return re.search(rf"(?<![\w-]){re.escape(words)}(?![\w-])", text) is not None


def undocumented_flags(text: str) -> list[str]:
    missing = []
    for path, parser in COMMANDS:
        missing += [f"{name(path)} {flag}" for flag in shown_flags(parser) if not mentions(text, flag)]
    return missing


def test_the_tree_is_read_whole() -> None:
    """A check on the walk itself, so that the tests below cannot pass by finding nothing."""
    paths = {name(path) for path, _ in COMMANDS}
    expected = ["train", "calibrate", "tui", "pairs synthesize", "workspace import-pairs", "model import"]
    expected += ["tune grpo", "tune export-peft", "serve", "request"]
    assert {name(tuple(words.split())) for words in expected} <= paths
    assert len(paths) >= 30
    assert "--kl-budget" in shown_flags(dict(COMMANDS)[("sweep",)])
    assert sum(len(shown_flags(parser)) for _, parser in COMMANDS) > 300


def test_every_command_is_in_the_command_reference() -> None:
    reference = REFERENCE.read_text()
    missing = [name(path) for path, _ in COMMANDS if path and not mentions(reference, name(path))]
    assert missing == [], f"commands with no mention in {REFERENCE.relative_to(REPO)}: {', '.join(missing)}"
    assert mentions(reference, "ster vector")


def test_every_flag_of_every_command_is_documented() -> None:
    missing = undocumented_flags(docs_text())
    assert missing == [], f"flags that no page under docs/ mentions: {', '.join(missing)}"


@pytest.mark.parametrize(("path", "parser"), ALIASES, ids=[name(path) for path, _ in ALIASES])
def test_ster_vector_repeats_the_steering_commands(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    """The docs describe ``ster vector <command>`` as another name for ``ster <command>``; hold the tree to it."""
    assert shown_flags(parser) == shown_flags(dict(COMMANDS)[path[1:]])


def test_a_flag_missing_from_the_docs_is_reported() -> None:
    """The check can fail: every mention of one real flag taken out of the pages is found missing, by name."""
    text = docs_text()
    assert undocumented_flags(text) == []
    without = re.sub(r"(?<![\w-])--neutral-count(?![\w-])", "", text)
    assert undocumented_flags(without) == ["ster sweep --neutral-count"]
