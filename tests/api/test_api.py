"""``import ster``: every API call returns the document ``ster --json`` prints for the same inputs, refuses in
the command's sentence, and runs the same job (on the toy; SmolLM2 under ``real`` in test_api_real.py)."""

from __future__ import annotations

import inspect
import json
import shutil
import signal
import subprocess
import sys
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ster
from ster.engine.protocol.jobs import request_class
from tests.conftest import REPO

VOLATILE = frozenset({"seconds", "elapsed_seconds", "tokens_per_second", "wall_seconds", "started", "finished"})
"""Document fields that time the run rather than say what it computed."""

TOY = ("--model", "ster:toy")


def steady(value: Any) -> Any:
    """A document without the fields that time the run."""
    if isinstance(value, dict):
        return {key: steady(item) for key, item in value.items() if key not in VOLATILE}
    if isinstance(value, list):
        return [steady(item) for item in value]
    return value


def cli_result(cli: Callable[..., Any], *args: Any) -> dict[str, Any]:
    run = cli("--json", *args)
    assert run.code == 0, run.out[-2000:] + run.err
    final = run.events[-1]
    assert final["type"] == "result"
    return final["data"]


def clear(*paths: Path) -> None:
    """Remove what the command wrote, so that the API's run writes the same paths afresh."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        for stray in path.parent.glob(path.name + ".*"):  # a study or a checkpoint beside it
            shutil.rmtree(stray) if stray.is_dir() else stray.unlink()


@pytest.fixture(scope="module")
def toy() -> ster.Model:
    return ster.open("ster:toy", progress=False)


@pytest.fixture(scope="module")
def direction(tmp_path_factory: pytest.TempPathFactory, toy: ster.Model) -> Path:
    out = tmp_path_factory.mktemp("direction") / "calm.json"
    toy.train(out, pairs="ster:pairs")
    return out


def same(cli: Callable[..., Any], args: list[Any], call: Callable[[], Any], *outputs: Path) -> Any:
    """Run the command, clear its outputs, run the API call; their documents are the same. Returns the API's."""
    expected = cli_result(cli, *args)
    clear(*outputs)
    document = call()
    assert steady(document.model_dump(mode="json")) == steady(expected)
    return document


def test_reading_fitting_and_evaluating_equal_the_commands(cli, toy: ster.Model, tmp_path: Path) -> None:
    states = tmp_path / "states.safetensors"
    same(cli, ["extract", *TOY, "--input", "ster:prompts", "--output", states, "--layers", "1,3"],
         lambda: toy.extract("ster:prompts", states, layers="1,3"), states)  # fmt: skip
    artifact = tmp_path / "pca.json"
    summary = same(cli, ["train", *TOY, "--pairs", "ster:pairs", "--method", "pca", "--output", artifact],
                   lambda: toy.train(artifact, pairs="ster:pairs", method="pca"), artifact)  # fmt: skip
    assert type(summary).__name__ == "ArtifactSummary" and summary.method == "pca"
    best = tmp_path / "best.json"
    same(cli, ["optimize", *TOY, "--pairs", "ster:pairs", "--output", best],
         lambda: toy.optimize(best, pairs="ster:pairs"), best)  # fmt: skip
    same(cli, ["evaluate", *TOY, "--vector", artifact, "--pairs", "ster:pairs"],
         lambda: toy.evaluate(artifact, pairs="ster:pairs"))  # fmt: skip
    same(cli, ["inspect", artifact], lambda: ster.inspect(artifact))


def test_generating_and_sweeping_equal_the_commands(cli, toy: ster.Model, direction: Path) -> None:
    plain = same(cli, ["generate", *TOY, "--prompt", "Tell me about the park.", "--max-new-tokens", "12"],
                 lambda: toy.generate("Tell me about the park.", max_new_tokens=12))  # fmt: skip
    steered = same(
        cli,
        ["generate", *TOY, "--prompt", "Tell me about the park.", "--max-new-tokens", "12", "--vector", direction,
         "--strength", "0.8x", "--temperature", "0.7", "--seed", "3"],
        lambda: toy.generate("Tell me about the park.", max_new_tokens=12, vector=direction, strength="0.8x",
                             temperature=0.7, seed=3),
    )  # fmt: skip
    assert steered.text != plain.text and steered.strength == 0.8 and steered.strength_unit == "relative"
    ablated = same(
        cli,
        ["generate", *TOY, "--prompt", "Hello", "--max-new-tokens", "6", "--vector", direction, "--mode", "ablate",
         "--layers", "1..2"],
        lambda: toy.generate("Hello", max_new_tokens=6, vector=direction, mode="ablate", layers="1..2"),
    )  # fmt: skip
    assert ablated.mode == "ablate" and ablated.edits
    same(
        cli,
        ["sweep", *TOY, "--vector", direction, "--prompts", "ster:prompts", "--strengths=-0.4x,0.4x",
         "--max-new-tokens", "4", "--neutral-count", "2"],
        lambda: toy.sweep(direction, prompts="ster:prompts", strengths=["-0.4x", "0.4x"], max_new_tokens=4,
                          neutral_count=2),
    )  # fmt: skip


def test_the_steering_block_steers_every_generation_inside_it_and_nothing_after(
    toy: ster.Model, direction: Path
) -> None:
    prompt = "Tell me about the park."
    before = toy.generate(prompt, max_new_tokens=10)
    given = toy.generate(prompt, max_new_tokens=10, vector=direction, strength="0.8x")
    with toy.steering(direction, strength="0.8x") as steered:
        assert steered is toy
        inside = toy.generate(prompt, max_new_tokens=10)
        with toy.steering(direction, strength="-0.8x"):
            inner = toy.generate(prompt, max_new_tokens=10)
        back = toy.generate(prompt, max_new_tokens=10)
    after = toy.generate(prompt, max_new_tokens=10)
    assert inside.model_dump() == back.model_dump() == given.model_dump()
    assert inner.strength == -0.8 and inner.text != inside.text
    assert after.model_dump() == before.model_dump() and after.vector is None
    with pytest.raises(ster.SterError, match="strength"):  # checked on entry, in the command's sentence
        with toy.steering(direction, strength="lots"):
            pass
    assert toy.generate(prompt, max_new_tokens=10).vector is None  # a refused block leaves nothing behind


def test_an_artifact_object_is_taken_where_a_path_is(toy: ster.Model, direction: Path) -> None:
    artifact = ster.load_artifact(direction)
    by_path = toy.generate("Hello", max_new_tokens=8, vector=direction)
    by_object = toy.generate("Hello", max_new_tokens=8, vector=artifact)
    assert by_object.text == by_path.text and by_object.relative_strength == by_path.relative_strength


def test_baking_and_importing_equal_the_commands(cli, toy: ster.Model, direction: Path, tmp_path: Path) -> None:
    cvec = tmp_path / "calm.gguf"
    same(cli, ["bake", *TOY, "--vector", direction, "--format", "llama-cpp", "--layers", "1..3", "--output", cvec],
         lambda: toy.bake(direction, cvec, format="llama-cpp", layers="1..3"), cvec)  # fmt: skip
    imported = tmp_path / "imported.json"
    same(cli, ["vector", "import", *TOY, cvec, "--output", imported],
         lambda: toy.import_vector(cvec, imported), imported)  # fmt: skip


def test_tuning_merging_and_exporting_equal_the_commands(cli, toy: ster.Model, tmp_path: Path) -> None:
    short = ["--epochs", "1", "--max-sequence", "48"]
    sft = tmp_path / "sft.safetensors"
    report = same(cli, ["tune", "sft", *TOY, "--examples", "ster:examples", "--output", sft, *short],
                  lambda: toy.sft("ster:examples", sft, epochs=1, max_sequence=48), sft)  # fmt: skip
    assert type(report).__name__ == "TrainResult"
    dpo = tmp_path / "ipo.safetensors"
    same(cli, ["tune", "dpo", *TOY, "--pairs", "ster:pairs", "--loss", "ipo", "--output", dpo, *short],
         lambda: toy.dpo(dpo, pairs="ster:pairs", loss="ipo", epochs=1, max_sequence=48), dpo)  # fmt: skip
    reward = tmp_path / "reward.safetensors"
    same(cli, ["tune", "reward", *TOY, "--pairs", "ster:pairs", "--output", reward, *short],
         lambda: toy.reward(reward, pairs="ster:pairs", epochs=1, max_sequence=48), reward)  # fmt: skip
    grpo = tmp_path / "grpo.safetensors"
    same(
        cli,
        ["tune", "grpo", *TOY, "--prompts", "ster:grpo-prompts", "--max-new-tokens", "4", "--group", "2",
         "--output", grpo, "--max-sequence", "48"],
        lambda: toy.grpo("ster:grpo-prompts", grpo, max_new_tokens=4, group=2, max_sequence=48),
        grpo,
    )  # fmt: skip
    same(cli, ["tune", "evaluate", *TOY, "--pairs", "ster:pairs", "--adapter", dpo],
         lambda: toy.evaluate_adapter(pairs="ster:pairs", adapter=dpo))  # fmt: skip
    same(cli, ["tune", "inspect", sft], lambda: ster.inspect_adapter(sft))
    merged = tmp_path / "merged"
    same(cli, ["tune", "merge", *TOY, "--adapter", sft, "--output", merged], lambda: toy.merge(sft, merged), merged)
    peft = tmp_path / "peft"
    same(cli, ["tune", "export-peft", sft, "--output", peft], lambda: ster.export_peft(sft, peft), peft)
    steered = toy.generate("Hello", max_new_tokens=6, adapter=sft)
    assert steered.adapter == str(sft)


def test_calibrating_equals_the_command(cli, toy: ster.Model, tmp_path: Path) -> None:
    out = tmp_path / "calibrated.json"
    flags = ["--trials", "4", "--layers", "2..3"]
    document = same(cli, ["calibrate", *TOY, "--pairs", "ster:pairs", "--output", out, *flags],
                    lambda: toy.calibrate(out, pairs="ster:pairs", trials=4, layers="2..3"), out)  # fmt: skip
    assert document.calibration is not None
    with toy.steering(out):  # no strength: the calibrated one, as ster generate takes it
        assert toy.generate("Hello", max_new_tokens=4).strength == round(document.calibration.positive.strength, 4)


def test_bad_arguments_raise_the_library_error_with_the_commands_sentence(cli, toy: ster.Model, tmp_path) -> None:
    cases: list[tuple[list[Any], Callable[[], Any]]] = [
        (["generate", *TOY, "--prompt", "Hi", "--max-new-tokens", "0"], lambda: toy.generate("Hi", max_new_tokens=0)),
        (["train", *TOY, "--pairs", tmp_path / "none.json", "--output", tmp_path / "a.json"],
         lambda: toy.train(tmp_path / "a.json", pairs=tmp_path / "none.json")),
        (["generate", *TOY, "--prompt", "Hi", "--vector", tmp_path / "none.json"],
         lambda: toy.generate("Hi", vector=tmp_path / "none.json")),
        (["generate", *TOY, "--prompt", "Hi", "--temperature", "-1"], lambda: toy.generate("Hi", temperature=-1)),
        (["inspect", REPO / "README.md"], lambda: ster.inspect(REPO / "README.md")),
    ]  # fmt: skip
    for args, call in cases:
        run = cli("--json", *args)
        assert run.code == 1
        sentence = run.events[-1]["message"]
        with pytest.raises(ster.SterError) as raised:
            call()
        assert str(raised.value) == sentence
        assert isinstance(raised.value, ster.Refusal)
        frames = [frame.co_filename for frame in _frames(raised.value.__traceback__)]
        assert all(name.endswith(("api.py", "test_api.py", "python.py", "raises.py")) for name in frames), frames
        assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert not list(tmp_path.iterdir())  # a refused call writes nothing
    with pytest.raises(ster.SterError, match="does not exist|cannot|not"):
        ster.open(str(tmp_path / "no-such-model"))


def _frames(traceback: Any) -> list[Any]:
    found = []
    while traceback is not None:
        found.append(traceback.tb_frame.f_code)
        traceback = traceback.tb_next
    return found


def test_progress_goes_to_a_callable_warnings_to_python_warnings(toy: ster.Model, direction: Path) -> None:
    seen: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        toy.generate("Hello", max_new_tokens=5, vector=direction, strength="12x", progress=seen.append)
    kinds = {event.type for event in seen}
    assert {"progress", "token", "log", "warning"} <= kinds
    assert (
        "".join(event.text for event in seen if event.type == "token")
        == toy.generate("Hello", max_new_tokens=5, vector=direction, strength="12x").text
    )
    assert any(issubclass(w.category, ster.SterWarning) and "drowns out" in str(w.message) for w in caught)


def test_every_request_field_is_a_parameter_of_its_method() -> None:
    """The API offers each job's every field, so nothing the command takes is out of reach from Python."""
    fixed = {"model", "revision", "precision", "device", "chat_template"}
    methods = {
        "extract": ster.Model.extract, "train": ster.Model.train, "optimize": ster.Model.optimize,
        "calibrate": ster.Model.calibrate, "evaluate": ster.Model.evaluate, "generate": ster.Model.generate,
        "sweep": ster.Model.sweep, "bake": ster.Model.bake, "tune sft": ster.Model.sft, "tune dpo": ster.Model.dpo,
        "tune reward": ster.Model.reward, "tune grpo": ster.Model.grpo, "tune evaluate": ster.Model.evaluate_adapter,
        "tune merge": ster.Model.merge, "tune export-peft": ster.export_peft, "inspect": ster.inspect,
        "tune inspect": ster.inspect_adapter, "model import": ster.import_model,
    }  # fmt: skip
    for job, method in methods.items():
        offered = set(inspect.signature(method).parameters) - {"self", "progress", "options"}
        options = inspect.signature(method).parameters.get("options")
        if options is not None:  # **options: Unpack[SomeOptions]
            unpacked = getattr(ster.api, str(options.annotation).removeprefix("Unpack[").removesuffix("]"))
            offered |= set(typing.get_type_hints(unpacked))
        wanted = set(request_class(job).model_fields) - fixed
        assert offered == wanted, job


def test_import_ster_imports_no_torch() -> None:
    code = (
        "import sys, ster, ster.api\n"
        "assert ster.open is ster.api.open and ster.SterError.__name__ == 'SterError'\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


CHILD = """
import json, sys, time
from pathlib import Path
import ster

out = Path(sys.argv[1])
toy = ster.open("ster:toy", progress=False)

def show(event):
    if event.type == "progress" and event.stage == "train":
        print("training", flush=True, file=sys.stderr)

started = time.monotonic()
try:
    toy.sft("ster:examples", out, epochs=100000, progress=show)
    ending = "finished"
except KeyboardInterrupt as interrupt:
    ending = str(interrupt)
stopped = time.monotonic() - started
after = toy.generate("Hello", max_new_tokens=3)  # the job thread is free again
print(json.dumps({"ending": ending, "written": sorted(p.name for p in out.parent.iterdir()), "tokens": after.tokens}))
"""


def test_ctrl_c_cancels_the_job_cleanly_and_raises_keyboard_interrupt(tmp_path: Path) -> None:
    """A real SIGINT to a script inside an endless SFT run: KeyboardInterrupt once the job has stopped, nothing
    written, and the next call runs."""
    from tests.protocol.test_interrupt import spawn

    out = tmp_path / "run" / "adapter.safetensors"
    out.parent.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = spawn(script, out)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("training"):
            break
    else:
        pytest.fail(f"the run ended before training began: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)
    out_text, err_text = proc.communicate(timeout=120)
    assert proc.returncode == 0, err_text
    report = json.loads(out_text.splitlines()[-1])
    assert report["ending"].startswith("cancelled") and "resume" in report["ending"], report
    assert report["written"] == ["adapter.safetensors.checkpoint"]  # what the command's Ctrl-C leaves: no adapter
    assert report["tokens"] == 3


def test_ster_exports_exactly_the_api() -> None:
    """``ster``'s lazy names and ``ster.api.__all__`` are one list written twice (so ``import ster`` need not import
    the API); they may not drift apart."""
    assert set(ster.__all__) - {"__version__"} == set(ster.api.__all__)
    assert all(getattr(ster, name) is getattr(ster.api, name) for name in ster.api.__all__)
