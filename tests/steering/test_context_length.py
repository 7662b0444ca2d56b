"""Texts a model cannot take: prompts, pair sides and generation budgets counted against its context
(``max_position_embeddings``: 128 on the toy, 8192 on SmolLM2) before any weight loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.model import context as length
from ster.engine.model.context import encode_within, generation_budget
from ster.engine.model.loading import ModelStore
from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.requests import GenerateRequest

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPT = "question : tell me about the town . answer :"
"""11 tokens on the toy."""
SENTENCE = "the sea is calm . "
"""5 tokens on the toy."""


def last_error(run) -> str:
    return run.err.strip().splitlines()[-1]


def codec_of(model: str | Path):
    ctx = JobContext(lambda event: None)
    return ModelStore().open(GenerateRequest(model=str(model), prompt="x"), ctx)


def write_pairs(path: Path, positive: str) -> Path:
    pairs = json.loads(PAIRS.read_text())
    pairs["pairs"][1]["positive"] = positive
    path.write_text(json.dumps(pairs))
    return path


# --- generate -------------------------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_is_refused_before_the_weights_load(cli) -> None:
    run = cli("generate", "--model", "ster:toy", "--prompt", SENTENCE * 1100)  # 19,800 characters
    assert run.code == 1 and run.out == ""
    assert last_error(run) == "error: the prompt is 5501 tokens long, more than the model's context of 128 tokens"
    assert "loading" not in run.err


def test_the_default_budget_stays_within_the_context_and_says_so(cli) -> None:
    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT)
    assert run.code == 0, run.err
    assert run.json["max_new_tokens"] == 117 and run.json["prompt_tokens"] == 11
    assert (
        "generating at most 117 tokens rather than the default 128: the model's context of 128 leaves that much "
        "room after the 11-token prompt"
    ) in run.err.splitlines()
    full = cli("generate", "--model", "ster:toy", "--prompt", SENTENCE * 25)  # 126 tokens: room for 2
    assert full.code == 0 and full.json["max_new_tokens"] == 2


def test_an_explicit_budget_past_the_context_is_refused(cli) -> None:
    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "118")
    assert run.code == 1 and last_error(run) == (
        "error: the 11-token prompt and --max-new-tokens 118 need 129 positions, more than the model's context of "
        "128; give --max-new-tokens 117 or fewer"
    )
    assert "loading" not in run.err
    fits = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "117")
    assert fits.code == 0 and fits.json["max_new_tokens"] == 117


def test_a_prompt_that_fills_the_context_leaves_no_room(cli) -> None:
    prompt = SENTENCE * 25 + "the sea"  # 128 tokens
    run = cli("generate", "--model", "ster:toy", "--prompt", prompt)
    assert run.code == 1 and last_error(run) == (
        "error: the 128-token prompt fills the model's context of 128 tokens, leaving no room to generate"
    )


def test_the_quick_start_still_runs_with_its_defaults(cli, tmp_path: Path) -> None:
    out = tmp_path / "calm.json"
    assert cli("optimize", "--model", "ster:toy", "--pairs", PAIRS, "--output", out).code == 0
    run = cli("generate", "--model", "ster:toy", "--vector", out, "--strength", "3", "--prompt", PROMPT)
    assert run.code == 0, run.err
    assert run.json["max_new_tokens"] == 117 and run.json["stop_reason"] == "eos" and run.json["text"]


# --- the other readers ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "optimize", "evaluate"])
def test_a_five_megabyte_pair_side_is_refused_quickly_and_nothing_is_written(cli, tmp_path: Path, command: str) -> None:
    pairs = write_pairs(tmp_path / "big.json", SENTENCE * 280_000)  # 5.04 MB
    out = tmp_path / "out.json"
    if command == "evaluate":
        assert cli("train", "--model", "ster:toy", "--pairs", PAIRS, "--output", out).code == 0
        run = cli("evaluate", "--model", "ster:toy", "--pairs", pairs, "--vector", out)
    else:
        run = cli(command, "--model", "ster:toy", "--pairs", pairs, "--output", out)
    assert run.code == 1 and run.out == ""
    assert last_error(run) == (
        "error: pair 1's positive side is at least 569 tokens long, more than the model's context of 128 tokens"
    )
    assert "loading" not in run.err
    assert out.exists() == (command == "evaluate")


def test_an_extract_prompt_longer_than_the_context_is_refused(cli, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": ["the sea is calm", SENTENCE * 30]}))
    run = cli("extract", "--model", "ster:toy", "--input", prompts, "--output", tmp_path / "x.json")
    assert run.code == 1 and last_error(run) == (
        "error: prompt 1 is 151 tokens long, more than the model's context of 128 tokens"
    )
    assert not (tmp_path / "x.json").exists() and "loading" not in run.err


def test_sweep_prompts_and_budget_are_checked_against_the_context(cli, tmp_path: Path) -> None:
    vector = tmp_path / "calm.json"
    assert cli("train", "--model", "ster:toy", "--pairs", PAIRS, "--output", vector, "--layers", "2").code == 0
    prompts = tmp_path / "prompts.json"
    sweep = ("sweep", "--model", "ster:toy", "--vector", vector, "--prompts", prompts, "--strengths=-2,2")
    prompts.write_text(json.dumps({"prompts": [PROMPT, SENTENCE * 30]}))
    run = cli(*sweep)
    assert run.code == 1 and last_error(run) == (
        "error: sweep prompt 1 is 151 tokens long, more than the model's context of 128 tokens"
    )
    prompts.write_text(json.dumps({"prompts": [PROMPT, SENTENCE * 20]}))  # the longest is 101 tokens
    assert last_error(cli(*sweep, "--max-new-tokens", "28")) == (
        "error: the 101-token prompt and --max-new-tokens 28 need 129 positions, more than the model's context of "
        "128; give --max-new-tokens 27 or fewer"
    )
    fitted = cli(*sweep)
    assert fitted.code == 0, fitted.err
    assert fitted.json["max_new_tokens"] == 27  # the default 48, within the context


# --- the count itself -----------------------------------------------------------------------------


def test_the_count_is_the_codecs_own_and_the_probe_only_refuses() -> None:
    checkpoint = codec_of("ster:toy")
    codec = checkpoint.codec
    assert encode_within(codec, PROMPT, 128, "the prompt") == codec.encode_prompt(PROMPT)
    spaces = "the" + " " * 200_000 + "sea"  # the probe sees one word: counted in full, and it fits
    assert encode_within(codec, spaces, 128, "the prompt") == codec.encode_prompt(spaces)
    with pytest.raises(Refusal, match="is at least"):
        encode_within(codec, SENTENCE * 10_000, 128, "the prompt")


def test_a_text_the_probe_cannot_decide_is_counted_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = codec_of("ster:toy").codec
    monkeypatch.setattr(length, "PROBE_ABOVE", 100)
    near = SENTENCE * 30  # 151 tokens: over the context, under twice it, longer than the probe's 16 x 8 characters
    with pytest.raises(Refusal) as refused:
        encode_within(codec, near, 8 * 16, "the prompt")
    assert str(refused.value) == "the prompt is 151 tokens long, more than the model's context of 128 tokens"


def test_generation_budgets() -> None:
    assert generation_budget(11, None, 128, 128) == 117
    assert generation_budget(11, None, 48, 128) == 48
    assert generation_budget(11, 117, 48, 128) == 117
    with pytest.raises(Refusal, match="give --max-new-tokens 117 or fewer"):
        generation_budget(11, 118, 48, 128)
    notes: list[str] = []
    generation_budget(100, None, 48, 128, notes.append)
    assert notes == [
        "generating at most 28 tokens rather than the default 48: the model's context of 128 leaves "
        "that much room after the 100-token prompt"
    ]


@pytest.mark.real
def test_smollm2_counts_against_its_8192_positions(cli, tmp_path: Path, smol: Path) -> None:
    pairs = write_pairs(tmp_path / "big.json", SENTENCE * 280_000)
    run = cli("train", "--model", smol, "--pairs", pairs, "--output", tmp_path / "out.json", "--layers", "12")
    assert run.code == 1 and "more than the model's context of 8192 tokens" in last_error(run)
    assert last_error(run).startswith("error: pair 1's positive side is at least ")
    assert "loading" not in run.err and not (tmp_path / "out.json").exists()
    long_prompt = cli("generate", "--model", smol, "--prompt", SENTENCE * 2000)
    assert long_prompt.code == 1 and last_error(long_prompt).endswith("more than the model's context of 8192 tokens")
    default = cli("generate", "--model", smol, "--prompt", "Tell me about the sea.", "--max-new-tokens", "3")
    assert default.code == 0 and default.json["max_new_tokens"] == 3
