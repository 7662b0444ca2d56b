"""The bundled toy checkpoint: its generator, its size, and examples written in its vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from tokenizers import Tokenizer

from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.engine.model.toy import build

ENGLISH = {"neutral.json"}
"""Bundled inputs written for real models, not by the toy's generator nor in its vocabulary: the neutral set of
everyday requests that calibrate measures cost on."""


def test_the_generator_rewrites_every_committed_file_but_the_trained_weights(tmp_path: Path) -> None:
    build(tmp_path, steps=2)
    for committed in [*TOY_DIR.iterdir(), *(p for p in EXAMPLES_DIR.rglob("*.json") if p.name not in ENGLISH)]:
        relative = committed.relative_to(TOY_DIR.parent)
        written = tmp_path / relative
        assert written.exists(), relative
        if committed.name != "model.safetensors":
            assert written.read_bytes() == committed.read_bytes(), relative
    with (
        safe_open(TOY_DIR / "model.safetensors", "pt") as old,
        safe_open(tmp_path / "toy" / "model.safetensors", "pt") as new,
    ):
        assert {k: old.get_slice(k).get_shape() for k in old.keys()} == {
            k: new.get_slice(k).get_shape() for k in new.keys()
        }


def test_the_committed_checkpoint_is_small() -> None:
    assert sum(p.stat().st_size for p in TOY_DIR.iterdir()) < 1_000_000


def test_every_example_is_written_in_the_toy_vocabulary() -> None:
    tokenizer = Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))
    texts: list[str] = []
    for path in (p for p in EXAMPLES_DIR.glob("*.json") if p.name not in ENGLISH):
        document = json.loads(path.read_text())
        texts += document.get("prompts", [])
        texts += [side for pair in document.get("pairs", []) for side in (pair["positive"], pair["negative"])]
        texts += [part for ex in document.get("examples", []) for part in (ex["prompt"], ex["completion"])]
    assert len(texts) > 30
    for text in texts:
        assert "<unk>" not in tokenizer.encode(text).tokens, text


def test_the_toy_answers_in_its_vocabulary(cli) -> None:
    result = cli("generate", "--model", "ster:toy", "--prompt", "question : what color is the grass ? answer :").json
    assert result["text"] == "the grass is green."
    assert result["stop_reason"] == "eos"
