"""Every flag's default is its request model's: a flag left out passes nothing, so the request's own default
applies, and each ``--help`` shows the request model's default.

The expected values are read here from the request models themselves (``model_fields``), not through
``ster.engine.protocol.jobs.request_default``, and compared with the help text as ``ster <command> --help`` prints it: a help
that retypes a default fails as soon as the model's changes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ster.cli import _fields, _request
from ster.commands import build_parser
from ster.engine.protocol.jobs import JOBS, request_class
from ster.engine.steering.requests import TrainRequest
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP
from ster.serve.client import jsonable
from ster.serve.wire import camel, prepare

Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def job_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    """Every command that runs a job (``ster vector <command>`` included), as its words and its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.get_default("job") is not None:
                    yield (*path, name), sub
                yield from job_commands(sub, (*path, name))


JOB_COMMANDS = list(job_commands(build_parser()))

NONE_SHOWN: dict[str, Any] = {
    "max_new_tokens": lambda kind: kind.default_max_new_tokens,
    "strength": lambda kind: DEFAULT_STRENGTH,
    "strengths": lambda kind: DEFAULT_SWEEP,
    "top_p": lambda kind: "off",
}
"""Fields whose None default the help names as a value: what the job then picks (or off, for no nucleus)."""


def shown(value: Any) -> str:
    """A default as the help writes it: a number in its shortest form (16, 0.0001, 0.25), anything else as text."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def model_defaults(job: str) -> dict[str, str]:
    """Field → the default its flag's help must show, for every field of the job's request that has a value to show
    (a flag that is on or off shows none)."""
    kind = request_class(job)
    found = {}
    for name, info in kind.model_fields.items():
        if info.is_required() or isinstance(info.default, bool):
            continue
        if info.default is not None:
            found[name] = shown(info.default)
        elif name in NONE_SHOWN:
            found[name] = shown(NONE_SHOWN[name](kind))
    return found


def flag_help(text: str, option: str) -> str | None:
    """The help of one flag in a ``--help`` text, joined onto one line; None where the text has no such flag."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"  {re.escape(option)}( |$)", line):
            rest = [line]
            for following in lines[i + 1 :]:
                if not following.startswith("   "):  # a blank line, a section, or the next flag (indented 2)
                    break
                rest.append(following)
            return " ".join(" ".join(rest).split())
    return None


def drift(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """Each flag of a job's command whose help, in ``text``, does not show its request model's default."""
    expected = model_defaults(parser.get_default("job"))
    wrong = []
    for action in parser._actions:
        if action.dest not in expected or not action.option_strings:
            continue
        option, value = action.option_strings[0], expected[action.dest]
        said = flag_help(text, option) or ""
        if not re.search(rf"default {re.escape(value)}(?![\w.])", said):
            wrong.append(f"{option}: the request's default is {value}, the help says: {said}")
    return wrong


def help_text(cli: Any, words: tuple[str, ...]) -> str:
    run = cli(*words, "--help")
    assert run.code == 0, run.err
    return str(run.out)


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """One width for every help text, whatever the terminal running the tests."""
    monkeypatch.setenv("COLUMNS", "100")


@pytest.mark.usefixtures("wide")
def test_every_help_shows_its_request_models_defaults(cli: Any) -> None:
    checked = 0
    for words, parser in JOB_COMMANDS:
        assert drift(parser, help_text(cli, words)) == [], " ".join(words)
        expected = model_defaults(parser.get_default("job"))
        checked += sum(1 for action in parser._actions if action.option_strings and action.dest in expected)
    assert len(JOB_COMMANDS) >= 30 and checked > 150  # the walk found the tree and its flags


@pytest.mark.usefixtures("wide")
def test_a_retyped_default_is_found(cli: Any) -> None:
    """The check can fail: a help that says another number than the model is named, flag and both values."""
    words, parser = next((words, parser) for words, parser in JOB_COMMANDS if words == ("tune", "grpo"))
    text = help_text(cli, words)
    assert drift(parser, text) == []
    retyped = text.replace("(default 0.04;", "(default 0.4;").replace("(default 512)", "(default 1024)")
    assert [line.split(":")[0] for line in drift(parser, retyped)] == ["--beta", "--max-sequence"]
    assert "the request's default is 0.04" in drift(parser, retyped)[0]


def test_a_flag_left_out_passes_nothing() -> None:
    """argparse holds no default of its own for any flag of a job, so none can differ from the request's."""
    for words, parser in JOB_COMMANDS:
        passing = [action.dest for action in parser._actions if action.default is not argparse.SUPPRESS]
        assert passing == [], " ".join(words)


TMP = "{tmp}"
REQUIRED = {
    "generate": ["--model", "ster:toy", "--prompt", "question : tell me about the town . answer :"],
    "train": ["--model", "ster:toy", "--pairs", "ster:pairs", "--output", f"{TMP}/calm.json"],
    "sweep": ["--model", "ster:toy", "--vector", f"{TMP}/calm.json", "--prompts", "ster:prompts"],
    "calibrate": ["--model", "ster:toy", "--pairs", "ster:pairs", "--output", f"{TMP}/calm.json"],
    "tune sft": ["--model", "ster:toy", "--examples", "ster:examples", "--output", f"{TMP}/a.safetensors"],
    "tune grpo": ["--model", "ster:toy", "--prompts", "ster:grpo-prompts", "--output", f"{TMP}/a.safetensors"],
}
"""Each command's required flags and nothing else (but the pairs, which a server without an active set requires)."""
OPERATIONS = {job: job.replace(" ", "/") for job in REQUIRED}


def parsed(job: str, tmp_path: Path) -> argparse.Namespace:
    argv = [arg.replace(TMP, str(tmp_path)) for arg in REQUIRED[job]]
    return build_parser().parse_args([*job.split(), *argv])


@pytest.mark.parametrize("job", REQUIRED)
def test_a_command_with_only_its_required_flags_is_its_request_models_defaults(job: str, tmp_path: Path) -> None:
    args = parsed(job, tmp_path)
    given = _fields(args)
    assert set(given) == {arg[2:].replace("-", "_") for arg in REQUIRED[job] if arg.startswith("--")}
    kind = request_class(job)
    defaults = {name: info.default for name, info in kind.model_fields.items() if name not in given}
    request = _request(args)
    assert len(defaults) >= 5
    assert {name: getattr(request, name) for name in defaults} == defaults
    assert request == kind.model_validate(given)


@pytest.mark.parametrize("job", REQUIRED)
def test_a_server_builds_the_same_request_from_what_the_cli_sends(job: str, tmp_path: Path) -> None:
    """``ster --server URL <command>`` sends the flags given, in camelCase; the server fills in the same defaults."""
    args = parsed(job, tmp_path)
    body = {camel(name): jsonable(value) for name, value in _fields(args).items()}
    assert prepare(OPERATIONS[job], body).request == _request(args)


class WiderTrain(TrainRequest):
    """``train``'s request with another default batch."""

    batch_size: int = 16


@pytest.mark.usefixtures("wide")
def test_a_default_changed_in_the_request_model_changes_the_flag(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One source: the model's new default is what ``train --help`` shows and what a run without the flag gets."""
    monkeypatch.setitem(JOBS, "train", (JOBS["train"][0], f"{__name__}:WiderTrain"))
    assert flag_help(help_text(cli, ("train",)), "--batch-size") == "--batch-size N pairs per forward pass (default 16)"
    request = _request(parsed("train", tmp_path))
    assert isinstance(request, WiderTrain) and request.batch_size == 16
