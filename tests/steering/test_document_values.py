"""Documents with values no run can have are refused by every reader, in one sentence naming the field.

A steering artifact is edited one field at a time into something Ster never writes (a NaN or negative activation
norm, an accuracy of 1.5, a layer of -1 or 10^30, a width of 0, a layer given as text) and read by ``inspect``,
``generate`` and ``evaluate``: exit 1, the sentence, no traceback. Ster writes per-layer values under the
original's key ``values`` and reads both that and ``vector``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from ster.engine.model.resolve import EXAMPLES_DIR

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPT = "question : tell me about the town . answer :"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ster.cli import main

    out = tmp_path_factory.mktemp("artifact") / "calm.json"
    assert main(["train", "--model", "ster:toy", "--pairs", str(PAIRS), "--output", str(out), "--layers", "1,2"]) == 0
    return out


@pytest.fixture
def artifact(written: Path) -> dict:
    return json.loads(written.read_text())


def layer(a: dict, **changes: object) -> dict:
    """The artifact with its first layer changed."""
    return {**a, "vectors": [{**a["vectors"][0], **changes}, *a["vectors"][1:]]}


def write(path: Path, document: dict | str) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


NAN, INF = float("nan"), float("inf")
CASES = [
    (
        lambda a: layer(a, activation_norm=NAN),
        "{path}: layer 1's activation_norm is nan; it is the mean norm of the "
        "states the direction was fitted on, a finite number above 0 (or null where it was not recorded)",
    ),
    (lambda a: layer(a, activation_norm=-5.0), "{path}: layer 1's activation_norm is -5.0; it is the mean norm"),
    (lambda a: layer(a, activation_norm=0), "{path}: layer 1's activation_norm is 0"),
    (lambda a: layer(a, activation_norm=INF), "{path}: layer 1's activation_norm is inf"),
    (
        lambda a: layer(a, train_accuracy=1.5),
        "{path}: layer 1's train_accuracy is 1.5; an accuracy lies between 0 and 1",
    ),
    (lambda a: layer(a, train_accuracy=-0.25), "{path}: layer 1's train_accuracy is -0.25"),
    (lambda a: layer(a, train_accuracy=NAN), "{path}: layer 1's train_accuracy is nan"),
    (lambda a: layer(a, train_margin=INF), "{path}: layer 1's train_margin is inf; a margin is a finite number"),
    (lambda a: layer(a, train_margin=NAN), "{path}: layer 1's train_margin is nan"),
    (lambda a: layer(a, layer=-1), "{path}: layer -1 is not a layer index; layers are numbered from 0"),
    (
        lambda a: layer(a, layer=10**30),
        "{path}: layer 1000000000000000000000000000000 is beyond any model's layers "
        "(Ster reads models of at most 4096 layers)",
    ),
    (
        lambda a: layer(a, layer="3"),
        "steering artifact {path} is not in the expected shape: vectors.0.layer: Input should be a valid integer",
    ),
    (lambda a: layer(a, layer=True), "steering artifact {path} is not in the expected shape: vectors.0.layer"),
    (lambda a: layer(a, layer=1.5), "steering artifact {path} is not in the expected shape: vectors.0.layer"),
    (
        lambda a: {**a, "hidden_size": 0, "vectors": [{**v, "values": []} for v in a["vectors"]]},
        "{path}: hidden_size 0 is not a width; it must be at least 1",
    ),
    (lambda a: {**a, "hidden_size": "64"}, "steering artifact {path} is not in the expected shape: hidden_size"),
    (
        lambda a: {**a, "method": "svm"},
        "steering artifact {path} is not in the expected shape: method: Input should be 'caa', 'pca', 'logistic' or 'imported'",
    ),
    (lambda a: {**a, "precision": "f64"}, "steering artifact {path} is not in the expected shape: precision"),
    (lambda a: {**a, "model": " "}, "{path} names no model"),
    (lambda a: {**a, "schema_version": "1"}, "steering artifact {path} is not in the expected shape: schema_version"),
]


@pytest.mark.parametrize(("change", "sentence"), CASES)
@pytest.mark.parametrize("command", ["inspect", "generate", "evaluate"])
def test_an_impossible_value_is_refused_by_every_reader(
    cli, tmp_path: Path, artifact: dict, change, sentence: str, command: str
) -> None:
    path = write(tmp_path / "bad.json", change(artifact))
    if command == "inspect":
        run = cli("inspect", path)
    elif command == "generate":
        run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--strength", "0.4x")
    else:
        run = cli("evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector", path)
    assert run.code == 1 and run.out == "", run.err
    assert run.err.strip().splitlines()[-1].startswith("error: " + sentence.format(path=path)), run.err
    assert "Traceback" not in run.err and "weights at" not in run.err


def test_a_nan_norm_written_as_json_nan_is_refused_without_a_traceback(cli, tmp_path: Path, artifact: dict) -> None:
    """The literal the issue found: Python's json reads NaN, and printing it back used to raise."""
    path = write(tmp_path / "nan.json", json.dumps(layer(artifact, activation_norm=NAN)))
    assert '"activation_norm": NaN' in path.read_text()
    for run in (
        cli("inspect", path),
        cli("--json", "inspect", path),
        cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path),
    ):
        assert run.code == 1 and "Traceback" not in run.err + run.out
        assert "activation_norm is nan" in run.err + run.out


def test_a_negative_norm_can_no_longer_steer_the_other_way(cli, tmp_path: Path, artifact: dict) -> None:
    """A negative activation_norm turned 0.4x into a push the opposite way, silently."""
    flipped = layer(artifact, activation_norm=-abs(artifact["vectors"][0]["activation_norm"]))
    path = write(tmp_path / "flipped.json", flipped)
    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--strength", "0.4x")
    assert run.code == 1 and "activation_norm is -" in run.err


@pytest.mark.parametrize("unit", ["norm", "spread"])
def test_a_null_unit_is_still_read_and_refuses_only_a_relative_strength(
    cli, tmp_path: Path, artifact: dict, unit: str
) -> None:
    """An older file (no strength_unit: the norm) with a null norm, or a spread-unit file with a null spread."""
    key = f"activation_{unit}"
    document = {**artifact, "vectors": [{**v, key: None} for v in artifact["vectors"]]}
    if unit == "norm":
        document.pop("strength_unit")
    path = write(tmp_path / "old.json", document)
    assert cli("inspect", path).code == 0
    assert (
        cli(
            "generate",
            "--model",
            "ster:toy",
            "--prompt",
            PROMPT,
            "--vector",
            path,
            "--strength",
            "3",
            "--max-new-tokens",
            "2",
        ).code
        == 0
    )
    relative = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--strength", "0.4x")
    assert relative.code == 1 and f"records no {key} for layer 1" in relative.err


def test_a_layer_the_model_lacks_is_refused_against_the_model(cli, tmp_path: Path, artifact: dict) -> None:
    path = write(tmp_path / "l9.json", layer(artifact, layer=9))
    assert cli("inspect", path).code == 0  # a layer index some model has; this one has 4
    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path)
    assert run.code == 1 and "artifact has a vector for layer 9, but this model has layers 0..3" in run.err


def test_a_blank_adapter_record_is_the_bare_checkpoint(cli, tmp_path: Path, artifact: dict) -> None:
    path = write(tmp_path / "blank.json", {**artifact, "adapter": ""})
    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--max-new-tokens", "2")
    assert run.code == 0 and "adapter" not in run.err, run.err
    assert cli("inspect", path).json["adapter"] is None


# --- the key per-layer values are written under ------------------------------------------------------------------


def test_ster_writes_values_the_original_key(written: Path) -> None:
    document = json.loads(written.read_text())
    for entry in document["vectors"]:
        assert list(entry) == [
            "layer",
            "values",
            "train_accuracy",
            "train_margin",
            "activation_norm",
            "activation_spread",
        ]
        assert math.isclose(math.hypot(*entry["values"]), 1.0, rel_tol=1e-6)


def test_both_keys_read_alike_by_every_reader(cli, tmp_path: Path, artifact: dict) -> None:
    """inspect (which the terminal app runs to name an artifact), evaluate, generate and sweep."""
    older = write(
        tmp_path / "older.json",
        {
            **artifact,
            "vectors": [{("vector" if k == "values" else k): x for k, x in v.items()} for v in artifact["vectors"]],
        },
    )
    newer = write(tmp_path / "newer.json", artifact)
    assert '"vector"' in older.read_text() and '"values"' not in older.read_text()
    prompts = write(tmp_path / "prompts.json", {"prompts": [PROMPT]})
    for command in (
        ["inspect"],
        ["evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector"],
        ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--strength", "3", "--max-new-tokens", "4", "--vector"],
        ["sweep", "--model", "ster:toy", "--prompts", prompts, "--strengths=-2,2", "--max-new-tokens", "3", "--vector"],
    ):
        a, b = cli(*command, older), cli(*command, newer)
        assert a.code == b.code == 0, a.err + b.err
        assert {**a.json, "vector": None} == {**b.json, "vector": None}


def test_the_terminal_apps_inspect_job_reads_both_keys(tmp_path: Path, artifact: dict) -> None:
    from ster.engine.protocol.events import Result
    from ster.engine.protocol.jobs import build_job_request, run_job

    older = write(
        tmp_path / "older.json",
        {
            **artifact,
            "vectors": [{("vector" if k == "values" else k): x for k, x in v.items()} for v in artifact["vectors"]],
        },
    )
    finals = [
        run_job("inspect", build_job_request("inspect", artifact=path), lambda e: None)
        for path in (older, write(tmp_path / "newer.json", artifact))
    ]
    assert all(isinstance(final, Result) for final in finals)
    assert finals[0].data == finals[1].data


# --- activation documents ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden_size": 0}, "hidden_size 0 is not a width"),
        ({"records": [{"prompt": "p", "tokens": 0, "layers": {"0": [0.5, 1.0]}}]}, "at least one token"),
        ({"records": [{"prompt": "p", "tokens": 2, "layers": {"-1": [0.5, 1.0]}}]}, 'layer "-1" is not a layer index'),
        ({"records": [{"prompt": "p", "tokens": 2, "layers": {"0": [0.5]}}]}, "has 1 values, but hidden_size is 2"),
        ({"records": [{"prompt": "p", "tokens": 2, "layers": {"0": [0.5, NAN]}}]}, "is not finite"),
        ({"precision": "f64"}, "precision"),
        ({"chat_template": "maybe"}, "chat_template"),
        ({"schema_version": 2}, "schema_version"),
    ],
)
def test_an_activation_document_with_impossible_values_is_never_written(change: dict, words: str) -> None:
    from ster.engine.steering.extract import ActivationDocument

    good = {
        "model": "ster:toy",
        "model_revision": None,
        "hidden_size": 2,
        "precision": "f32",
        "chat_template": "absent",
        "records": [{"prompt": "p", "tokens": 2, "layers": {"0": [0.5, 1.0]}}],
    }
    ActivationDocument.model_validate(good)
    with pytest.raises(ValidationError, match=words):
        ActivationDocument.model_validate({**good, **change})
