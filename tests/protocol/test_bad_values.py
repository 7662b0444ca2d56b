"""One rule for bad values, across every flag of every command.

Exit 2 is for the command's shape only: an unknown command or flag, a missing required
flag, a flag given without its value. Every value is checked by the job's request model
(or, for a path, by the job before it writes anything) and refused with exit 1 and one
sentence. The matrix below drives each value-taking flag with values that are not
numbers, not finite, negative where that makes no sense, or not among the choices; a
completeness test makes sure no flag is left out.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import pytest

from ster.commands import (
    CALIBRATION_MODES,
    CHAT_MODES,
    DEVICES,
    FORMATS,
    GENERATORS,
    METHODS,
    MODES,
    PRECISIONS,
    build_parser,
)
from ster.engine.model.requests import DEVICE_ALIASES, ChatMode, Device, Precision
from ster.engine.protocol.requests import SEED_MAX

WHOLE = ["abc", "1.5", "nan", "1e3", "", "0", "-3"]
SEED = ["abc", "1.5", "-1", str(SEED_MAX + 1), "99999999999999999999999"]
FINITE = ["abc", "nan", "inf", "-inf", "1e400", ""]
COUNT = ["abc", "1.5", "nan", "1e3", "", "-3"]
"""A whole number of which 0 is a fine value."""
VALUES: dict[str, list[str]] = {
    "--max-new-tokens": WHOLE,
    "--batch-size": WHOLE,
    "--count": WHOLE,
    "--retry-multiplier": WHOLE,
    "--seed": SEED,
    "--index": ["abc", "1.5", "-1"],
    "--dedupe-bits": ["abc", "1.5", "-1", "64"],
    "--dedupe-bands": ["abc", "0", "65", "-2"],
    "--strength": FINITE,
    "--temperature": [*FINITE, "-1", "-0.5"],
    "--top-p": [*FINITE, "0", "-0.5", "1.5"],
    "--refusal-threshold": [*FINITE, "-0.1", "1.5"],
    "--strengths": ["abc", "1,,2", "nan", "1,inf", "", "1;2", "-1e400"],
    "--layers": ["x", "-1", "5..5", "2..1", "1,,2", "1.5", "nan", "", "1..", "1,4..x"],
    "--precision": ["f64", "F32", ""],
    "--device": ["gpu", "Metal", ""],
    "--chat-template": ["on", ""],
    "--method": ["svm", "CAA"],
    "--generator": ["cloud", ""],
    "--rank": WHOLE,
    "--epochs": WHOLE,
    "--accumulation": WHOLE,
    "--max-sequence": [*WHOLE, "1"],
    "--warmup-steps": COUNT,
    "--checkpoint-every": COUNT,
    "--alpha": [*FINITE, "0", "-1"],
    "--learning-rate": [*FINITE, "0", "-1e-4"],
    "--beta": [*FINITE, "0", "-0.1"],
    "--targets": ["nope", "", ",", "q,zz"],
    "--loss": ["kto", "DPO", ""],
    "--group": [*WHOLE, "1"],
    "--iterations": WHOLE,
    "--kl-budget": [*FINITE, "0", "-0.1"],
    "--trials": WHOLE,
    "--neutral-count": WHOLE,
    "--mode": ["subtract", "ADD", ""],
    "--format": ["gguf", "Checkpoint", ""],
    "--direction-layer": ["abc", "1.5", "-1"],
    "--peak-weight": FINITE,
    "--peak-layer": FINITE,
    "--min-weight": FINITE,
    "--falloff": [*FINITE, "-1"],
}
"""Each flag whose value the request model checks, and values it must refuse."""

SUBJECTS = (
    "supervised fine-tuning requires",
    "direct preference optimization requires",
    "reward modeling requires",
    "group-relative policy optimization requires",
)
MENTIONS = {
    "--layers": ("--layers", "layer range"),
    "--generator": ("unknown generator",),
    "--rank": ("--rank", "adapter rank"),
    "--alpha": ("--alpha", "adapter alpha"),
    "--targets": ("unknown adapter target", "no targets selected"),
    "--max-sequence": ("--max-sequence", "max_sequence must be at least two tokens"),
    "--beta": (
        "--beta",
        "direct preference optimization requires a finite beta",
        "evaluation requires a finite beta",
        "group-relative policy optimization requires a finite beta",
    ),
    "--temperature": ("--temperature", "group-relative policy optimization requires a temperature"),
    "--max-new-tokens": ("--max-new-tokens", "max_new_tokens must be greater than zero"),
    "--group": ("--group", "group-relative policy optimization requires a group"),
    "--iterations": ("--iterations", "group-relative policy optimization requires at least one iteration"),
    "--loss": ("unknown preference loss",),
    "--batch-size": ("--batch-size", "evaluation requires a batch", *SUBJECTS),
    **{flag: (flag, *SUBJECTS) for flag in ("--epochs", "--accumulation", "--learning-rate")},
}
"""What a refusal of the flag starts with, where it is not the flag itself."""

FREE_TEXT = {
    "--prompt",
    "--positive",
    "--negative",
    "--trait",
    "--trait-name",
    "--opposite",
    "--name",
    "--revision",
    "--generator-model",
    "id",
    "--base-model",
    "--judge-question",
}
"""Flags whose value is text with nothing to check (a route is checked only when it is used)."""

PATHS = {
    "--model",
    "--pairs",
    "--vector",
    "--input",
    "--output",
    "--prompts",
    "--import-pairs",
    "artifact",
    "gguf",
    "source",
    "--examples",
    "--adapter",
    "adapter",
    "--reward",
    "--neutral",
    "--holdout",
    "--judge",
    "--refusal-markers",
    "control_vector",
}
"""Flags that name a file or model; the job refuses a bad one (tested in ``test_a_bad_path_is_refused``)."""

FRONT_END = {"--host", "--port", "--token-file", "--root", "--server", "operation"}
"""Flags of ``serve``, ``request`` and ``--server`` themselves, not of a job: their refusals are tested in
``tests/serve`` (a bad port, an unreadable token file, a root that is not a directory, an unknown operation)."""

BASE = {
    "train": ["--model", "ster:toy", "--output", "{tmp}/out.json"],
    "optimize": ["--model", "ster:toy", "--output", "{tmp}/out.json"],
    "evaluate": ["--model", "ster:toy", "--vector", "{tmp}/missing.json"],
    "generate": ["--model", "ster:toy", "--prompt", "x"],
    "extract": ["--model", "ster:toy", "--input", "{tmp}/missing.json", "--output", "{tmp}/out.json"],
    "sweep": [
        "--model",
        "ster:toy",
        "--vector",
        "{tmp}/missing.json",
        "--prompts",
        "{tmp}/missing.json",
        "--strengths=1",
    ],
    "calibrate": ["--model", "ster:toy", "--output", "{tmp}/out.json"],
    "pairs inspect": ["--pairs", "{tmp}/missing.json"],
    "pairs remove": ["--pairs", "{tmp}/missing.json", "--index", "0"],
    "pairs synthesize": ["--trait", "x", "--count", "1", "--output", "{tmp}/out.json", "--model", "ster:toy"],
    "tune sft": ["--model", "ster:toy", "--examples", "{tmp}/missing.json", "--output", "{tmp}/out.safetensors"],
    "tune dpo": ["--model", "ster:toy", "--output", "{tmp}/out.safetensors"],
    "tune reward": ["--model", "ster:toy", "--output", "{tmp}/out.safetensors"],
    "tune evaluate": ["--model", "ster:toy", "--examples", "{tmp}/missing.json"],
    "tune grpo": ["--model", "ster:toy", "--prompts", "{tmp}/missing.json", "--output", "{tmp}/out.safetensors"],
    "import": ["--model", "ster:toy", "--output", "{tmp}/out.json", "{tmp}/missing.gguf"],
    "bake": ["--model", "ster:toy", "--vector", "{tmp}/missing.json", "--output", "{tmp}/out"],
    "tune merge": ["--model", "ster:toy", "--adapter", "{tmp}/a.safetensors", "--output", "{tmp}/out"],
}
"""The required flags of each command, with values that pass the request (the files need not exist: a value
refusal comes first, which the assertion on the sentence's start makes sure of)."""


def _value_flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(command path, flag) for every flag or positional that takes a value."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _value_flags(sub, (*path, name))
        elif action.nargs is None and action.const is None and not isinstance(action, argparse._VersionAction):
            found.append((" ".join(path), action.option_strings[0] if action.option_strings else action.dest))
    return found


FLAGS = _value_flags(build_parser())
FINE = {
    ("tune grpo", "--beta", "0"),
    *(
        (command, "--layers", "")
        for command in ("generate", "sweep", "bake", "vector generate", "vector sweep", "vector bake")
    ),
}
"""Values one command accepts though the flag's list refuses them elsewhere: grpo's beta 0 turns the KL off, and
a blank optional text is none (``--layers`` of generate, sweep and bake then takes the mode's own sites)."""
CASES = [
    (command, flag, value)
    for command, flag in FLAGS
    if flag in VALUES and command.removeprefix("vector ") in BASE
    for value in VALUES[flag]
    if (command, flag, value) not in FINE
]


def test_every_value_flag_is_covered() -> None:
    unknown = {flag for _, flag in FLAGS} - set(VALUES) - FREE_TEXT - PATHS - FRONT_END
    assert unknown == set()
    assert {command.removeprefix("vector ") for command, flag in FLAGS if flag in VALUES} <= set(BASE)
    assert len(CASES) > 300


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_a_bad_value_is_refused_in_one_sentence(cli, tmp_path: Path, command: str, flag: str, value: str) -> None:
    base = [arg.format(tmp=tmp_path) for arg in BASE[command.removeprefix("vector ")]]
    run = cli(*command.split(), *base, f"{flag}={value}")
    assert (run.code, run.out) == (1, ""), run.err
    lines = run.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(tuple(f"error: {m}" for m in MENTIONS.get(flag, (flag,)))), lines
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (
            [
                "generate",
                "--model",
                "ster:toy",
                "--prompt",
                "x",
                "--temperature",
                "0.7",
                "--seed",
                "99999999999999999999999",
            ],
            "--seed must be between 0 and 18446744073709551615",
        ),
        (
            ["generate", "--model", "ster:toy", "--prompt", "x", "--strength", "abc"],
            "--strength must be a number such as 3 or a multiple of each layer's activation spread such as 0.4x; "
            'got "abc"',
        ),
        (
            ["generate", "--model", "ster:toy", "--prompt", "x", "--max-new-tokens", "x"],
            '--max-new-tokens must be a whole number; got "x"',
        ),
        (
            ["generate", "--model", "ster:toy", "--prompt", "x", "--device", "gpu"],
            "--device must be 'cpu', 'cuda', 'mps' or 'auto'; got \"gpu\"",
        ),
        (
            ["sweep", "--model", "ster:toy", "--vector", "v", "--prompts", "p", "--strengths=nan"],
            "--strengths must be a finite number; got nan",
        ),
        (
            ["sweep", "--model", "ster:toy", "--vector", "v", "--prompts", "p", "--strengths=1,x"],
            "--strengths must be a number such as 3 or a multiple of each layer's activation spread such as 0.4x; "
            'got "x"',
        ),
        (
            ["train", "--model", "ster:toy", "--output", "o", "--layers", "x"],
            "--layers takes all, a comma list such as 2,5, or a half-open range such as 2..6, or a mix such as 1,4..7; "
            'got "x"',
        ),
        (["pairs", "inspect", "--refusal-threshold", "2"], "--refusal-threshold must be between 0 and 1"),
        (["pairs", "remove", "--pairs", "p", "--index", "-1"], "--index must be 0 or more"),
    ],
)
def test_the_sentences(cli, args: list[str], sentence: str) -> None:
    run = cli(*args)
    assert (run.code, run.out, run.err) == (1, "", f"error: {sentence}\n")


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--model", "ster:toy", "--prompt", "x", "--strenght", "2"],  # unknown flag
        ["generate", "--model", "ster:toy", "--prompt"],  # a flag without its value
        ["generate", "--model", "ster:toy"],  # a missing required flag
        ["sweep", "--model", "ster:toy", "--vector", "v", "--prompts", "p", "--strengths", "-8,-4"],  # no = before "-"
        ["train", "--model", "ster:toy", "--output", "o", "--layers"],
        ["pairs", "frobnicate"],  # unknown subcommand
        ["frobnicate"],  # unknown command
        ["pairs", "synthesize", "--trait", "x", "--output", "o"],
        ["model", "import", "--output", "o"],  # the positional FILE.gguf is missing
    ],
)
def test_the_command_shape_is_a_usage_error(cli, args: list[str]) -> None:
    run = cli(*args)
    assert run.code == 2 and run.out == "" and "usage: ster" in run.err


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["train", "--model", "ster:toy", "--pairs", "{tmp}/missing.json", "--output", "{tmp}/o.json"], "pair set"),
        (["train", "--model", "ster:toy", "--pairs", "{examples}/pairs.json", "--output", "{tmp}"], "output"),
        (
            ["train", "--model", "{tmp}/no-model", "--pairs", "{examples}/pairs.json", "--output", "{tmp}/o.json"],
            "model directory",
        ),
        (
            ["evaluate", "--model", "ster:toy", "--pairs", "{examples}/pairs.json", "--vector", "{tmp}/v.json"],
            "steering artifact",
        ),
        (["generate", "--model", "ster:toy", "--prompt", "x", "--vector", "{tmp}/v.json"], "steering artifact"),
        (["extract", "--model", "ster:toy", "--input", "{tmp}/p.json", "--output", "{tmp}/o.json"], "input"),
        (
            ["sweep", "--model", "ster:toy", "--vector", "{tmp}/v.json", "--prompts", "{tmp}/p.json", "--strengths=1"],
            "",
        ),
        (["inspect", "{tmp}/v.json"], "steering artifact"),
        (["pairs", "inspect", "--pairs", "{tmp}/p.json"], "pair set"),
        (["pairs", "remove", "--pairs", "{tmp}/p.json", "--index", "0"], "pair set"),
        (["workspace", "import-pairs", "{tmp}/p.json"], "pair set"),
        (["onboarding", "--import-pairs", "{tmp}/p.json"], "pair set"),
        (["model", "import", "{tmp}/m.gguf", "--output", "{tmp}/out"], "GGUF file"),
    ],
)
def test_a_bad_path_is_refused(cli, tmp_path: Path, examples: Path, args: list[str], start: str) -> None:
    run = cli(*[arg.format(tmp=tmp_path, examples=examples) for arg in args])
    assert (run.code, run.out) == (1, ""), run.err
    last = run.err.splitlines()[-1]
    assert last.startswith(f"error: {start}") and "Traceback" not in run.err, run.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("listed", "literal"),
    [
        (PRECISIONS, Precision),
        (CHAT_MODES, ChatMode),
        (tuple(d for d in DEVICES if d not in DEVICE_ALIASES), typing.get_args(Device)[0]),
    ],
)
def test_the_help_lists_what_the_request_accepts(listed: tuple[str, ...], literal: object) -> None:
    assert listed == typing.get_args(literal)


def test_methods_and_generators_in_the_help_match_the_engine() -> None:
    from ster.engine.steering.requests import TrainRequest

    assert METHODS == typing.get_args(TrainRequest.model_fields["method"].annotation)
    assert GENERATORS == ("local", "brama")


def test_modes_and_formats_in_the_help_match_the_engine() -> None:
    from ster.engine.steering.requests import BakeRequest, CalibrateRequest, GenerateRequest

    assert MODES == typing.get_args(GenerateRequest.model_fields["mode"].annotation)
    assert CALIBRATION_MODES == typing.get_args(CalibrateRequest.model_fields["mode"].annotation)
    assert FORMATS == typing.get_args(BakeRequest.model_fields["format"].annotation)


@pytest.mark.parametrize("command", ["generate", "train", "sweep", "pairs synthesize"])
def test_the_choices_stay_visible_in_the_help(cli, command: str) -> None:
    run = cli(*command.split(), "--help")
    help_text = " ".join(run.out.split())
    assert "{f32,f16,bf16,int8}" in help_text and "{cpu,cuda,mps,metal,auto}" in help_text and "{auto,off}" in help_text
