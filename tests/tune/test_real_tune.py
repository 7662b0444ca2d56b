"""The training loop on a real model: SmolLM2-135M-Instruct, with data sets written for it.

Each objective is trained on one half of a set and judged on the other, held-out half:

* SFT on sixteen questions answered as ``{"answer": "..."}`` lowers the held-out completion
  loss below the base model's, and most greedy answers to held-out questions take the format;
* DPO on calm-chosen / alarmed-rejected pairs ranks held-out pairs by implicit reward, and the
  two loops check each other: the calm steering direction fitted on the same pairs, read on
  the DPO model's generations as ``sweep`` reads its texts, sits further toward calm than on
  the base model's generations;
* a reward model trained on the same pairs ranks held-out pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tune.conftest import CALM_FIT, CALM_HELD, CALM_PROMPTS, FORMAT_HELD

pytestmark = pytest.mark.real


def _json(cli, *args: object) -> dict:
    run = cli(*args)
    assert run.code == 0, run.err
    return run.json


def test_sft_lowers_held_out_loss_and_teaches_the_format(cli, smol: Path, trained: dict[str, Path]) -> None:
    base = _json(cli, "tune", "evaluate", "--model", smol, "--examples", FORMAT_HELD)
    tuned = _json(cli, "tune", "evaluate", "--model", smol, "--examples", FORMAT_HELD, "--adapter", trained["sft"])
    assert tuned["loss"] < base["loss"] / 2, (base["loss"], tuned["loss"])
    prompts = [example["prompt"] for example in json.loads(FORMAT_HELD.read_text())["examples"]]
    answers = [
        _json(
            cli, "generate", "--model", smol, "--prompt", prompt, "--adapter", trained["sft"], "--max-new-tokens", "12"
        )["text"]
        for prompt in prompts
    ]
    formatted = [text for text in answers if text.startswith('{"answer": "')]
    assert len(formatted) >= 0.75 * len(prompts), answers


def test_dpo_ranks_held_out_pairs_and_moves_generations_toward_calm(
    cli, smol: Path, trained: dict[str, Path], tmp_path: Path
) -> None:
    held = _json(cli, "tune", "evaluate", "--model", smol, "--pairs", CALM_HELD, "--adapter", trained["dpo"])
    assert held["accuracy"] >= 0.8, held
    direction = tmp_path / "calm.ster.json"
    _json(cli, "train", "--model", smol, "--pairs", CALM_FIT, "--layers", "21", "--output", direction)
    prompts = json.loads(CALM_PROMPTS.read_text())["prompts"]
    base_texts = [_generate(cli, smol, prompt) for prompt in prompts]
    tuned_texts = [_generate(cli, smol, prompt, "--adapter", trained["dpo"]) for prompt in prompts]
    base, tuned = _calm_projection(smol, direction, base_texts), _calm_projection(smol, direction, tuned_texts)
    assert sum(tuned) / len(tuned) > sum(base) / len(base), (base, tuned, tuned_texts)


def test_a_reward_model_ranks_held_out_pairs(cli, smol: Path, trained: dict[str, Path]) -> None:
    held = _json(cli, "tune", "evaluate", "--model", smol, "--pairs", CALM_HELD, "--adapter", trained["reward"])
    assert held["accuracy"] >= 0.8, held


def _generate(cli, smol: Path, prompt: str, *extra: object) -> str:
    return _json(cli, "generate", "--model", smol, "--prompt", prompt, "--max-new-tokens", "40", *extra)["text"]


def _calm_projection(smol: Path, direction: Path, texts: list[str]) -> list[float]:
    """Each text read unsteered on the base model, encoded as sweep encodes its texts, projected on the direction."""
    from ster.engine.model.loading import ModelStore
    from ster.engine.model.requests import ModelRequest
    from ster.engine.protocol.jobs import JobContext
    from ster.engine.steering.artifact import load_artifact
    from ster.engine.steering.runs import text_projections

    ctx = JobContext(lambda event: None)
    store = ModelStore()
    checkpoint = store.open(ModelRequest(model=str(smol)), ctx)
    decoder = store.decoder(checkpoint, ctx)
    encoded = [checkpoint.codec.encode_prompt(text) for text in texts]
    return text_projections(decoder, encoded, load_artifact(direction).by_layer())
