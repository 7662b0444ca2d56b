"""Artifacts and pair sets that refuse misuse: one sentence each, exit 1, nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ster.engine.model.resolve import EXAMPLES_DIR
from tests.conftest import run_subprocess

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPT = "question : tell me about the town . answer :"
TOY_PRINT = "22158bce652a"
"""The first 12 hex digits of the bundled toy checkpoint's fingerprint."""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from ster.cli import main

    out = tmp_path_factory.mktemp("artifact") / "calm.json"
    assert main(["train", "--model", "ster:toy", "--pairs", str(PAIRS), "--output", str(out), "--layers", "1,2"]) == 0
    written = json.loads(out.read_text())
    # Ster writes the original's key, values; the cases below edit the list under vector, the key it also reads.
    return {
        **written,
        "vectors": [{("vector" if k == "values" else k): x for k, x in v.items()} for v in written["vectors"]],
    }


def unit(vector: list[float]) -> list[float]:
    norm = math.hypot(*vector)
    return [x / norm for x in vector]


def write(path: Path, document: dict | str) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def last_error(run) -> str:
    return run.err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (lambda a: {**a, "product": "wisent"}, '{path} was written by product "wisent", not by ster'),
        (lambda a: {**a, "schema_version": 9}, "{path} has schema version 9; this Ster reads version 1"),
        (
            lambda a: {**a, "model": "meta-llama/Llama-3.2-1B", "model_fingerprint": None},
            'artifact was trained for model "meta-llama/Llama-3.2-1B", current model is "ster:toy"',
        ),
        (
            lambda a: {**a, "model": "meta-llama/Llama-3.2-1B", "model_fingerprint": "ster-fp1:" + "0" * 64},
            'artifact was trained for model "meta-llama/Llama-3.2-1B", current model is "ster:toy", and their checkpoint '
            f"fingerprints differ too (000000000000 and {TOY_PRINT})",
        ),
        (
            lambda a: {**a, "model_fingerprint": "ster-fp1:" + "0" * 64},
            'artifact was trained for model "ster:toy" with checkpoint fingerprint 000000000000, but the checkpoint now at '
            f'"ster:toy" has fingerprint {TOY_PRINT}: its weights or architecture changed since the direction was fitted',
        ),
        (
            lambda a: {**a, "vectors": [{**v, "vector": [x * 1e30 for x in v["vector"]]} for v in a["vectors"]]},
            "{path}: layer 1's vector has norm 1e+30 where Ster writes unit directions, so it was written or edited "
            "elsewhere",
        ),
        (
            lambda a: {**a, "vectors": [{**v, "vector": [0.0] * 64} for v in a["vectors"]]},
            "{path}: layer 1's vector is all zeros, so it has no direction to steer along",
        ),
        (
            lambda a: {**a, "vectors": [{**v, "values": v["vector"]} for v in a["vectors"]]},
            "steering artifact {path} is not in the expected shape: vectors.0: a layer carries both vector and values "
            "(two names for one list); keep one",
        ),
        (
            lambda a: {
                **a,
                "hidden_size": 32,
                "vectors": [{**v, "vector": unit(v["vector"][:32])} for v in a["vectors"]],
            },
            "artifact width 32 does not match model width 64",
        ),
        (
            lambda a: {**a, "vectors": [{**a["vectors"][0], "layer": 7}]},
            "artifact has a vector for layer 7, but this model has layers 0..3",
        ),
        (
            lambda a: {**a, "vectors": [{**a["vectors"][0], "vector": a["vectors"][0]["vector"][:-1]}]},
            "{path}: layer 1's vector has 63 values, but the artifact's hidden_size is 64",
        ),
        (
            lambda a: {"rank": 8, "alpha": 16, "targets": ["q_proj"], "layers": [0]},
            "{path} is a LoRA adapter sidecar, not a steering artifact: it carries rank and targets where a steering "
            "artifact carries trait_name and vectors",
        ),
        (
            lambda a: {"trait_name": "calm"},
            "steering artifact {path} is not in the expected shape: model: Field required",
        ),
    ],
)
@pytest.mark.parametrize("command", ["generate", "evaluate"])
def test_misused_artifacts_are_refused(
    cli, tmp_path: Path, artifact: dict, change, sentence: str, command: str
) -> None:
    path = write(tmp_path / "bad.json", change(artifact))
    if command == "generate":
        run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path)
    else:
        run = cli("evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector", path)
    assert run.code == 1 and run.out == ""
    assert last_error(run) == "error: " + sentence.format(path=path)
    assert "Traceback" not in run.err


def test_a_non_finite_value_is_refused(cli, tmp_path: Path, artifact: dict) -> None:
    text = json.dumps(artifact).replace(str(artifact["vectors"][0]["vector"][5]), "NaN", 1)
    path = write(tmp_path / "nan.json", text)
    run = cli("inspect", path)
    assert run.code == 1 and last_error(run) == f"error: {path}: layer 1's vector holds a non-finite value"


def test_inspect_summarises_without_vectors_or_torch(tmp_path: Path, artifact: dict) -> None:
    path = write(tmp_path / "a.json", artifact)
    code = (
        f"import sys\nfrom ster.cli import main\nmain(['inspect', {str(path)!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "NO TORCH" in proc.stderr
    summary = json.loads(proc.stdout)
    assert list(summary) == [
        "schema_version",
        "product",
        "model",
        "model_revision",
        "model_fingerprint",
        "trait_name",
        "method",
        "hidden_size",
        "precision",
        "chat_template",
        "adapter",
        "metadata",
        "layers",
        "calibration",
        "strength_unit",
    ]
    assert summary["model_fingerprint"].startswith(f"ster-fp1:{TOY_PRINT}")
    assert [list(layer) for layer in summary["layers"]][0] == [
        "layer",
        "width",
        "norm",
        "train_accuracy",
        "train_margin",
        "activation_norm",
        "activation_spread",
        "vector_norm",
    ]
    assert all(abs(layer["norm"] - 1.0) < 1e-6 for layer in summary["layers"])


def test_a_non_unit_direction_is_refused_by_inspect_too(cli, tmp_path: Path, artifact: dict) -> None:
    halved = {**artifact, "vectors": [{**v, "vector": [x / 2 for x in v["vector"]]} for v in artifact["vectors"]]}
    path = write(tmp_path / "half.json", halved)
    run = cli("inspect", path)
    assert run.code == 1 and run.out == ""
    assert last_error(run) == (
        f"error: {path}: layer 1's vector has norm 0.5 where Ster writes unit directions, so "
        f"it was written or edited elsewhere"
    )
    nudged = {**artifact, "vectors": [{**v, "vector": [x * 1.0005 for x in v["vector"]]} for v in artifact["vectors"]]}
    assert cli("inspect", write(tmp_path / "nudged.json", nudged)).code == 0  # within 1e-3 of unit length


def test_vectors_stored_under_values_read_like_vector(cli, tmp_path: Path, artifact: dict) -> None:
    renamed = {
        **artifact,
        "vectors": [{("values" if k == "vector" else k): x for k, x in v.items()} for v in artifact["vectors"]],
    }
    original, values = write(tmp_path / "vector.json", artifact), write(tmp_path / "values.json", renamed)
    assert '"values"' in values.read_text() and '"vector"' not in values.read_text()
    assert '"vector"' in original.read_text() and '"values"' not in original.read_text()
    for command in (
        ["inspect"],
        ["evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector"],
        ["generate", "--model", "ster:toy", "--prompt", PROMPT, "--strength", "3", "--vector"],
    ):
        a, b = cli(*command, original), cli(*command, values)
        assert a.code == b.code == 0, b.err
        assert {**a.json, "vector": None} == {**b.json, "vector": None}


def test_provenance_mismatches_warn_but_run(cli, tmp_path: Path, artifact: dict) -> None:
    path = write(tmp_path / "a.json", artifact)
    run = cli(
        "evaluate",
        "--model",
        "ster:toy",
        "--pairs",
        PAIRS,
        "--vector",
        path,
        "--chat-template",
        "off",
        "--precision",
        "f16",
    )
    assert run.code == 0
    assert (
        "warning: this direction was trained with chat template absent and this run encodes off, so the "
        "accuracy and margin below describe a format it was not trained in"
    ) in run.err
    assert (
        "warning: this direction was trained at precision f32 and this run maps the base weights at f16, so it "
        "is being read in a different space than it was fitted in"
    ) in run.err
    steered = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--precision", "bf16")
    assert steered.code == 0 and "trained at precision f32 and this run maps the base weights at bf16" in steered.err
    unrecorded = write(tmp_path / "old.json", {**artifact, "precision": None, "chat_template": None})
    quiet = cli(
        "evaluate",
        "--model",
        "ster:toy",
        "--pairs",
        PAIRS,
        "--vector",
        unrecorded,
        "--chat-template",
        "off",
        "--precision",
        "f16",
    )
    assert quiet.code == 0 and "warning" not in quiet.err


@pytest.mark.parametrize(
    ("document", "sentence"),
    [
        ({"trait_name": "calm", "pairs": []}, "pair set {path} contains no pairs"),
        (
            {"trait_name": "calm", "pairs": [{"positive": "the sea is", "negative": " "}]},
            "pair set {path} contains an empty positive or negative prompt",
        ),
        (
            "{",
            "pair set {path} is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        ({"trait_name": "calm"}, "pair set {path} is not in the expected shape: pairs: Field required"),
    ],
)
@pytest.mark.parametrize("command", ["train", "optimize", "evaluate"])
def test_bad_pair_sets_are_refused(cli, tmp_path: Path, artifact: dict, document, sentence: str, command: str) -> None:
    path = write(tmp_path / "pairs.json", document)
    out = tmp_path / "out.json"
    flags = ["--vector", write(tmp_path / "a.json", artifact)] if command == "evaluate" else ["--output", out]
    run = cli(command, "--model", "ster:toy", "--pairs", path, *flags)
    assert run.code == 1 and last_error(run) == "error: " + sentence.format(path=path)
    assert not out.exists()


def test_optimize_needs_four_pairs(cli, tmp_path: Path) -> None:
    pairs = json.loads(PAIRS.read_text())
    path = write(tmp_path / "three.json", {**pairs, "pairs": pairs["pairs"][:3]})
    run = cli("optimize", "--model", "ster:toy", "--pairs", path, "--output", tmp_path / "o.json")
    assert run.code == 1 and last_error(run) == (
        f"error: optimize needs at least 4 pairs, so that some are held out to rank on; pair set {path} has 3"
    )
    assert not (tmp_path / "o.json").exists()


def test_pca_on_one_pair_is_refused(cli, tmp_path: Path) -> None:
    pairs = json.loads(PAIRS.read_text())
    path = write(tmp_path / "one.json", {**pairs, "pairs": pairs["pairs"][:1]})
    run = cli("train", "--model", "ster:toy", "--pairs", path, "--output", tmp_path / "o.json", "--method", "pca")
    assert run.code == 1 and "pca needs at least 2 pairs" in run.err and not (tmp_path / "o.json").exists()


def test_sweep_strengths_must_be_numbers() -> None:
    run = run_subprocess(
        "sweep", "--model", "ster:toy", "--vector", "v.json", "--prompts", "p.json", "--strengths", "1,x"
    )
    assert run.code == 1 and run.err == (
        "error: --strengths must be a number such as 3 or a multiple of each "
        'layer\'s activation spread such as 0.4x; got "x"\n'
    )


def test_the_chat_template_warning_says_what_each_command_does_with_the_direction(
    cli, tmp_path: Path, artifact: dict
) -> None:
    path = write(tmp_path / "a.json", artifact)
    prompts = write(tmp_path / "prompts.json", {"prompts": [PROMPT]})
    start = "warning: this direction was trained with chat template absent and this run encodes off, "
    runs = {
        "generate": (
            cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", path, "--chat-template", "off"),
            "so it steers a prompt encoded in a format it was not trained in",
        ),
        "sweep": (
            cli(
                "sweep",
                "--model",
                "ster:toy",
                "--vector",
                path,
                "--prompts",
                prompts,
                "--strengths=-2,2",
                "--max-new-tokens",
                "4",
                "--chat-template",
                "off",
            ),
            "so this sweep steers, and measures its effect, in a format it was not trained in",
        ),
        "evaluate": (
            cli("evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector", path, "--chat-template", "off"),
            "so the accuracy and margin below describe a format it was not trained in",
        ),
    }
    for command, (run, ending) in runs.items():
        assert run.code == 0, (command, run.err)
        assert start + ending in run.err.splitlines(), command
    assert "the number below" not in "".join(run.err for run, _ in runs.values())
