"""Inputs no run can use, refused in one sentence before a weight is read: text that is not text, a file that is
not a regular file, a rank larger than the projection it factors, a config.json no model has.

The FIFO cases run in a fresh interpreter with a timeout, because the failure they guard against is a read that
never returns; the rank and config cases check that torch was never imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ster.engine.protocol.errors import Refusal
from tests.conftest import REPO

PROBE = (
    "import sys; from ster.cli import main; code = main(sys.argv[1:]); "
    "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
)
LONE = "\ud800"


def probe(*args: object, timeout: float = 120) -> tuple[int, list[str]]:
    """Exit code and stderr lines of ``ster ARGS`` in a fresh interpreter; the last line says whether torch loaded."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=timeout
    )
    return proc.returncode, proc.stderr.splitlines()


def last_error(run) -> str:
    line = run.err.strip().splitlines()[-1]
    assert run.code == 1 and line.startswith("error: ") and "Traceback" not in run.err, run.err
    return line


# --- lone surrogates --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        {"examples": [{"prompt": "a cat" + LONE, "completion": "has four legs"}]},
        {"examples": [{"prompt": "a cat", "completion": "has four legs"}], "name": LONE},
    ],
)
def test_a_lone_surrogate_in_an_example_document_is_refused(cli, tmp_path: Path, document: dict) -> None:
    path = tmp_path / "examples.json"
    path.write_text(json.dumps(document))  # json.dumps spells it "\ud800", as an editor or another tool would
    line = last_error(cli("tune", "sft", "--model", "ster:toy", "--examples", path, "--output", tmp_path / "a.st"))
    assert f"example set {path} holds a lone surrogate (U+D800) at " in line and "which is not a character" in line
    assert not (tmp_path / "a.st").exists()


def test_a_lone_surrogate_in_json_lines_is_refused_naming_the_line(cli, tmp_path: Path) -> None:
    path = tmp_path / "examples.jsonl"
    path.write_text(
        json.dumps({"prompt": "a", "completion": "b c"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "x" + LONE}, {"role": "assistant", "content": "y"}]})
        + "\n"
    )
    line = last_error(cli("tune", "sft", "--model", "ster:toy", "--examples", path, "--output", tmp_path / "a.st"))
    assert line == (
        f'error: {path} line 2 holds a lone surrogate (U+D800) at "messages.0.content", which is not a '
        "character; write the character itself or a valid surrogate pair"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--model", "ster:toy", "--prompt", "hello" + LONE],
        ["generate", "--model", "ster:toy", "--prompt", "hello\udcff"],  # a byte that is not UTF-8, as argv holds it
        ["pairs", "add", "--pairs", "{tmp}/p.json", "--positive", "calm" + LONE, "--negative", "alarmed"],
        ["sweep", "--model", "ster:toy", "--vector", "{tmp}/v.json", "--prompt", "a" + LONE],
    ],
)
def test_a_lone_surrogate_on_the_command_line_is_refused(cli, tmp_path: Path, args: list[str]) -> None:
    run = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    if run.code == 2:
        pytest.skip("this command takes no such flag")
    assert "holds a lone surrogate" in last_error(run) and "which is not a character" in last_error(run)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("pairs.json", {"trait_name": "calm", "pairs": [{"positive": "a" + LONE, "negative": "b"}]}),
        ("prompts.json", {"prompts": ["the sea is", LONE]}),
    ],
)
def test_a_lone_surrogate_in_a_pair_or_prompt_set_is_refused(cli, tmp_path: Path, name: str, document: dict) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    if name == "pairs.json":
        run = cli("train", "--model", "ster:toy", "--pairs", path, "--output", tmp_path / "a.json")
    else:
        run = cli("extract", "--model", "ster:toy", "--input", path, "--output", tmp_path / "a.json")
    assert "holds a lone surrogate (U+D800) at " in last_error(run)
    assert not (tmp_path / "a.json").exists()


def test_a_lone_surrogate_in_a_request_body_is_refused_before_running(tmp_path: Path) -> None:
    body = '{"model": "ster:toy", "prompt": "hi \\ud800"}'
    proc = subprocess.run(
        [sys.executable, "-m", "ster", "request", "generate"],
        input=body,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["json"]["error"].startswith("--prompt holds a lone surrogate (U+D800)")


# --- files that are not regular files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (
            ["tune", "sft", "--model", "ster:toy", "--examples", "{fifo}", "--output", "{tmp}/a.safetensors"],
            "--examples",
        ),
        (["tune", "dpo", "--model", "ster:toy", "--pairs", "{fifo}", "--output", "{tmp}/a.safetensors"], "--pairs"),
        (
            ["tune", "grpo", "--model", "ster:toy", "--prompts", "{fifo}", "--output", "{tmp}/a.safetensors"],
            "--prompts",
        ),
        (["tune", "evaluate", "--model", "ster:toy", "--examples", "{fifo}"], "--examples"),
        (["train", "--model", "ster:toy", "--pairs", "{fifo}", "--output", "{tmp}/a.json"], "--pairs"),
        (["extract", "--model", "ster:toy", "--input", "{fifo}", "--output", "{tmp}/a.json"], "--input"),
        (["inspect", "{fifo}"], "ARTIFACT"),
        (["generate", "--model", "ster:toy", "--prompt", "hi", "--adapter", "{fifo}"], "--adapter"),
        (["model", "import", "{fifo}", "--output", "{tmp}/m"], "FILE.gguf"),
    ],
)
def test_a_fifo_input_is_refused_without_blocking(tmp_path: Path, args: list[str], flag: str) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    try:  # a refusal takes about a second; a read that blocks never ends
        code, lines = probe(*[a.replace("{fifo}", str(fifo)).replace("{tmp}", str(tmp_path)) for a in args], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ster blocked on the FIFO given as {flag}")
    assert code == 1 and lines[-2] == f"error: {flag} {fifo} is a FIFO, not a regular file; give a file", lines
    assert lines[-1] == "False"  # refused before torch was imported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fifo"]


def test_the_readers_never_block_on_a_fifo_swapped_in_after_the_check(tmp_path: Path) -> None:
    """The readers open without blocking and look at what they opened, so a FIFO that appears after the request was
    checked is refused too (this would hang forever if the open blocked)."""
    from ster.engine.protocol.files import read_json
    from ster.engine.tune.data import load_examples, load_preferences, load_prompts

    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    for read in (
        lambda: read_json(fifo, "pair set"),
        lambda: load_examples(fifo),
        lambda: load_preferences(fifo),
        lambda: load_prompts(fifo),
    ):
        outcome: list[BaseException | None] = []

        def attempt(read=read, outcome=outcome) -> None:
            try:
                read()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        reader = threading.Thread(target=attempt, daemon=True)
        reader.start()
        reader.join(timeout=20)
        if reader.is_alive():  # blocked in open(): give it a writer so the test process can end, then fail
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(timeout=20)
            pytest.fail("a reader blocked on a FIFO")
        assert isinstance(outcome[0], Refusal) and f"{fifo} is a FIFO, not a regular file" in str(outcome[0])


# --- ranks ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [2**63, 10**8, 10**5, 65])
def test_a_rank_above_the_projection_is_refused_before_torch(tmp_path: Path, rank: int) -> None:
    code, lines = probe(
        "tune",
        "sft",
        "--model",
        "ster:toy",
        "--examples",
        "ster:examples",
        "--rank",
        rank,
        "--output",
        tmp_path / "a.safetensors",
    )
    assert code == 1 and lines[-2] == (
        f"error: adapter rank {rank} is above 64, the smaller side of the query "
        "projection (64x64) of this model; choose a rank of at most 64"
    ), lines
    assert lines[-1] == "False"
    assert list(tmp_path.iterdir()) == []


def test_a_rank_is_judged_by_each_target(cli, tmp_path: Path) -> None:
    """The toy's MLP is 64 -> 160: its smaller side is still 64, so 64 trains and 65 does not."""
    run = cli(
        "tune",
        "sft",
        "--model",
        "ster:toy",
        "--examples",
        "ster:examples",
        "--rank",
        "65",
        "--targets",
        "up,down",
        "--output",
        tmp_path / "a.safetensors",
    )
    assert "the smaller side of the up projection (160x64)" in last_error(run)
    ok = cli(
        "tune",
        "sft",
        "--model",
        "ster:toy",
        "--examples",
        "ster:examples",
        "--rank",
        "64",
        "--targets",
        "up",
        "--accumulation",
        "1",
        "--output",
        tmp_path / "b.safetensors",
    )
    assert ok.code == 0, ok.err


# --- config.json ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"vocab_size": -1}, "vocab_size -1 is not a size a model has"),
        ({"hidden_size": 0}, "hidden_size 0 is not a size a model has"),
        ({"intermediate_size": -256}, "intermediate_size -256 is not a size a model has"),
        ({"num_hidden_layers": 0}, "num_hidden_layers 0 is not a size a model has"),
        ({"num_hidden_layers": 10**6}, "num_hidden_layers 1000000 is more than any model has"),
        ({"num_attention_heads": 0}, "num_attention_heads 0 is not a size a model has"),
        (
            {"num_attention_heads": 6, "num_key_value_heads": 6, "head_dim": None},
            "hidden_size 64 does not divide into its 6 attention heads",
        ),
        ({"num_key_value_heads": 0}, "num_key_value_heads 0 is not a size a model has"),
        ({"head_dim": -16}, "head_dim -16 is not a size a model has"),
        ({"max_position_embeddings": 0}, "max_position_embeddings 0 is not a size a model has"),
        ({"rope_theta": float("nan")}, "rope_theta nan must be a finite number above 0"),
        ({"rope_theta": float("inf")}, "rope_theta inf must be a finite number above 0"),
        ({"rms_norm_eps": 0}, "rms_norm_eps 0.0 must be a finite number above 0"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": -8}}, "rope_scaling: factor -8.0 must be a finite number"),
    ],
)
def test_an_impossible_config_is_refused_before_torch(tmp_path: Path, toy_copy: Path, change: dict, words: str) -> None:
    config = json.loads((toy_copy / "config.json").read_text())
    (toy_copy / "config.json").write_text(json.dumps({**config, **change}))
    for args in (
        ["generate", "--model", toy_copy, "--prompt", "hi"],
        ["tune", "sft", "--model", toy_copy, "--examples", "ster:examples", "--output", tmp_path / "a.safetensors"],
    ):
        code, lines = probe(*args)
        assert (
            code == 1
            and lines[-2].startswith(f"error: model config {toy_copy / 'config.json'} is not a usable llama config: ")
            and words in lines[-2]
        ), lines
        assert lines[-1] == "False"
    assert not (tmp_path / "a.safetensors").exists()


# --- GGUF -------------------------------------------------------------------------------------------------------


def test_a_directory_given_as_the_gguf_says_it_is_one(cli, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    line = last_error(cli("model", "import", tmp_path / "models", "--output", tmp_path / "out"))
    assert line == f"error: GGUF file {tmp_path / 'models'} is a directory; give the .gguf file itself"
    assert not (tmp_path / "out").exists()
