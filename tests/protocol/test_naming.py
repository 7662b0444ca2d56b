"""Sentences name a request's fields through one function: the command line's flags by default, a front end's
labels within ``named``, per thread; and no engine sentence spells a flag of its own."""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

import pytest

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import build_job_request
from ster.engine.protocol.naming import field_name, flag, named
from ster.engine.protocol.requests import refusal_of
from ster.engine.steering.requests import GenerateRequest
from ster.engine.tune.requests import SftRequest

ENGINE = Path(__file__).resolve().parents[2] / "ster" / "engine"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_a_field_is_its_flag_unless_a_front_end_names_it() -> None:
    assert (flag("max_new_tokens"), flag("artifact"), field_name("max_sequence")) == (
        "--max-new-tokens",
        "ARTIFACT",
        "max_sequence",
    )
    with named({"max_new_tokens": "max tokens", "max_sequence": "max sequence"}):
        assert (flag("max_new_tokens"), flag("seed"), field_name("max_sequence")) == (
            "max tokens",
            "--seed",
            "max sequence",
        )
        seen: list[str] = []
        worker = threading.Thread(target=lambda: seen.append(flag("max_new_tokens")))
        worker.start()
        worker.join()
        assert seen == ["--max-new-tokens"]  # another thread speaks in flags until it is told otherwise
    assert flag("max_new_tokens") == "--max-new-tokens"


def test_a_refusal_is_composed_in_the_words_it_is_asked_for() -> None:
    fields = {"model": "ster:toy", "prompt": "hi", "max_new_tokens": 0}
    with pytest.raises(Refusal, match="^--max-new-tokens must be at least 1$"):
        build_job_request("generate", **fields)
    with named({"max_new_tokens": "max tokens"}), pytest.raises(Refusal, match="^max tokens must be at least 1$"):
        build_job_request("generate", **fields)
    # a text the request cannot parse, and a check of the contract's own wording
    with named({"seed": "seed box"}):
        assert refusal_of(GenerateRequest, {"model": "ster:toy", "prompt": "hi"}, "seed", "x") == (
            'seed box must be a whole number; got "x"'
        )
    valid = {"model": "ster:toy", "examples": "ster:examples", "output": Path("a.safetensors")}
    assert refusal_of(SftRequest, valid, "max_sequence", "1") == (
        "max_sequence must be at least two tokens, so that one token can predict another"
    )
    assert refusal_of(SftRequest, valid, "max_sequence", "64") is None


def _literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (module, class, function or attribute)."""
    tree = ast.parse(path.read_text())
    documented = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documented
    ]


def test_no_engine_sentence_spells_a_flag_itself() -> None:
    """A flag in a sentence goes through ``flag`` (so the app's labels reach it); what may spell one is a whole
    command to type (it holds ``ster ``), the toy's own training script, and serve's --root (no request field)."""
    spelled = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name == "toy.py":
            continue
        for line, text in _literals(path):
            flags = set(FLAG.findall(text)) - {"--root"}
            if flags and "ster " not in text:
                spelled.append(f"{path.relative_to(ENGINE)}:{line} {sorted(flags)}")
    assert not spelled, spelled
