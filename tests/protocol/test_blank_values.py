"""A blank value means none, as the contract says, on the command line and in a request body alike.

A blank (empty or only spaces) path or optional text is None where the field is optional, and missing where it is
required; it is never the current directory (``Path("")`` is ``.``), and never an internal error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JOBS, build_job_request, request_class
from ster.engine.protocol.paths import is_path_field
from ster.serve import wire
from tests.conftest import REPO

PROMPT = "question : tell me about the town . answer :"
BLANKS = ["", "   ", "\t"]


def _blankable(kind) -> list[str]:
    fields = kind.model_fields
    return [
        name
        for name, field in fields.items()
        if is_path_field(field.annotation)
        or name == "model"
        or (str in getattr(field.annotation, "__args__", ()) and type(None) in field.annotation.__args__)
    ]


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_blank_path_or_optional_text_of_every_request_means_none(job: str) -> None:
    from ster.engine.protocol.requests import blank_means_none

    kind = request_class(job)
    for name in _blankable(kind):
        for blank in BLANKS:
            cleaned = blank_means_none(kind, {name: blank})
            if kind.model_fields[name].is_required():
                assert name not in cleaned, (job, name)  # then refused as missing, never read as "."
            else:
                assert cleaned[name] is None, (job, name)


def test_blank_vector_and_adapter_generate_unsteered_on_the_bare_checkpoint(cli) -> None:
    baseline = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "4")
    for blank in BLANKS:
        run = cli(
            "generate",
            "--model",
            "ster:toy",
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "4",
            "--vector",
            blank,
            "--adapter",
            blank,
        )
        assert run.code == 0, run.err
        assert run.json["vector"] is None and run.json["adapter"] is None
        assert run.json["text"] == baseline.json["text"]


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["evaluate", "--model", "ster:toy", "--pairs", "ster:pairs", "--vector", ""], "--vector is required"),
        (["inspect", " "], "ARTIFACT is required"),
        (["train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", ""], "--output is required"),
        (["tune", "inspect", ""], "ARTIFACT is required"),
        (["model", "import", "", "--output", "out"], "FILE.gguf is required"),
        (["generate", "--model", "", "--prompt", PROMPT], "--model is required"),
        (
            ["tune", "sft", "--model", " ", "--examples", "ster:examples", "--output", "a.safetensors"],
            "--model is required",
        ),
    ],
)
def test_a_blank_required_path_is_missing_not_the_current_directory(cli, args: list[str], sentence: str) -> None:
    run = cli(*args)
    assert run.code == 1 and run.err.strip() == f"error: {sentence}", run.err


def test_a_blank_pair_set_is_the_workspaces_active_set(cli, tmp_path: Path) -> None:
    none = cli("train", "--model", "ster:toy", "--pairs", " ", "--output", tmp_path / "x.json")
    assert none.code == 1 and none.err.strip().startswith("error: no pair set is active in the workspace"), none.err
    assert cli("workspace", "import-pairs", "ster:pairs").code == 0
    run = cli("pairs", "inspect", "--pairs", "")
    assert run.code == 0, run.err


def test_a_blank_optional_text_is_none(tmp_path: Path) -> None:
    request = build_job_request(
        "tune export-peft", adapter=str(tmp_path / "a.safetensors"), output=str(tmp_path / "peft"), base_model="  "
    )
    assert request.base_model is None
    synth = build_job_request(
        "pairs synthesize",
        trait="calm",
        count=1,
        output=str(tmp_path / "p.json"),
        model="ster:toy",
        opposite="",
        trait_name=" ",
        generator_model="",
        revision="",
    )
    assert synth.opposite is None and synth.trait_name is None
    assert synth.revision is None and synth.generator_model is None


def _request(operation: str, body: dict) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "ster", "request", operation],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    return proc.returncode, json.loads(proc.stdout.splitlines()[-1])


def test_blank_fields_of_a_request_body_mean_none() -> None:
    code, result = _request(
        "generate", {"model": "ster:toy", "prompt": PROMPT, "maxNewTokens": 3, "vector": "", "adapter": " "}
    )
    assert code == 0 and result["status"] == 0, result
    code, result = _request("evaluate", {"model": "ster:toy", "pairs": "ster:pairs", "vector": ""})
    assert code == 2 and result["json"] == {"error": "evaluate requires a steering artifact"}


@pytest.mark.parametrize("body", [{"vector": ""}, {"adapter": ""}, {"vector": " ", "adapter": "\t"}])
def test_the_wire_builds_the_request_serve_runs_with_none(body: dict) -> None:
    prepared = wire.prepare("generate", {"model": "ster:toy", "prompt": PROMPT, **body})
    assert prepared.request.vector is None and prepared.request.adapter is None


def test_a_blank_tune_evaluate_adapter_scores_the_bare_checkpoint() -> None:
    request = build_job_request("tune evaluate", model="ster:toy", examples="ster:examples", adapter="")
    assert request.adapter is None
    with pytest.raises(Refusal, match="--pairs measures an adapter"):
        build_job_request("tune evaluate", model="ster:toy", pairs="ster:pairs", adapter=" ")
