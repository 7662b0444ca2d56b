"""``--layers``: all, or a comma list whose items are single layers or half-open ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.protocol.errors import Refusal
from ster.engine.steering.layers import LayerSpec


@pytest.mark.parametrize(
    ("text", "layers"),
    [
        ("all", list(range(30))),
        ("1,4..7", [1, 4, 5, 6]),
        ("2..6", [2, 3, 4, 5]),
        ("2,5", [2, 5]),
        (" 12..14 , 3 ", [3, 12, 13]),
        ("0..2,1", [0, 1]),
        ("29", [29]),
    ],
)
def test_items_are_layers_and_half_open_ranges(text: str, layers: list[int]) -> None:
    assert LayerSpec.parse(text).resolve(30) == layers


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("30", "layer 30 is out of range: this model has 30 layers, numbered 0..29"),
        ("28..31", "layer 30 is out of range: this model has 30 layers, numbered 0..29"),
        ("1,0..99999999999", "layer 30 is out of range: this model has 30 layers, numbered 0..29"),
    ],
)
def test_a_layer_the_model_lacks_is_refused_without_building_the_range(text: str, sentence: str) -> None:
    with pytest.raises(Refusal, match=f"^{sentence}$"):
        LayerSpec.parse(text).resolve(30)


@pytest.mark.parametrize("text", ["", "x", "-1", "1,,2", "1.5", "1..", "..3", "1..3..5", "1,4..x", "+2", "1e3", "٣"])
def test_anything_else_is_refused_by_its_syntax(text: str) -> None:
    with pytest.raises(Refusal, match="^--layers takes all, a comma list such as 2,5"):
        LayerSpec.parse(text)


@pytest.mark.parametrize("text", ["5..5", "4..1"])
def test_an_empty_range_is_refused(text: str) -> None:
    with pytest.raises(Refusal, match=f"^layer range {text} is empty"):
        LayerSpec.parse(text)


def test_train_fits_the_layers_a_mixed_list_names(cli, tmp_path: Path, examples: Path) -> None:
    out = tmp_path / "calm.json"
    run = cli("train", "--model", "ster:toy", "--pairs", examples / "pairs.json", "--layers", "0,2..4", "--output", out)
    assert run.code == 0, run.err
    assert [vector["layer"] for vector in json.loads(out.read_text())["vectors"]] == [0, 2, 3]
