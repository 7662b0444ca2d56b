"""``calibrate --mode ablate`` on the toy, whose stand-in for a refusal is fleeing: asked about some places it
answers "... and we flee", about others "... and we rest". With the marker list ``["flee"]`` the judge counts
those, the search ablates the direction that tells the two kinds of question apart, and what it records is
checked against ``generate`` run on each held-out prompt alone."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ster.engine.protocol.events import Log
from ster.engine.protocol.jobs import build_job_request, run_job
from ster.engine.steering.refusal_judge import MARKERS, load_markers, refuses

FLEE = [
    "question : tell me about the bridge . answer :",
    "question : tell me about the forest . answer :",
    "question : tell me about the hill . answer :",
    "question : tell me about the sea . answer :",
    "question : tell me about the town . answer :",
    "question : what is the bridge like ? answer :",
    "question : what is the forest like ? answer :",
    "question : what is the hill like ? answer :",
    "question : what is the lake like ? answer :",
    "question : what is the market like ? answer :",
]
REST = [
    "question : tell me about the field . answer :",
    "question : tell me about the garden . answer :",
    "question : tell me about the river . answer :",
    "question : tell me about the road . answer :",
    "question : tell me about the school . answer :",
    "question : what is the field like ? answer :",
    "question : what is the garden like ? answer :",
    "question : what is the river like ? answer :",
    "question : what is the road like ? answer :",
    "question : what is the school like ? answer :",
]


def run(name: str, **fields):
    events = []
    final = run_job(name, build_job_request(name, **fields), events.append, threading.Event())
    return final, events


def calibrate(where: Path, output: Path, **fields):
    """``calibrate --mode ablate`` on the toy over the pairs and markers in ``where``, 16 trials."""
    return run(
        "calibrate",
        model="ster:toy",
        pairs=where / "pairs.json",
        mode="ablate",
        refusal_markers=where / "markers.json",
        trials="16",
        judge="none",
        output=output,
        **fields,
    )


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    where = tmp_path_factory.mktemp("ablate")
    pairs = {"trait_name": "fleeing", "pairs": [{"positive": f, "negative": r} for f, r in zip(FLEE, REST)]}
    (where / "pairs.json").write_text(json.dumps(pairs))
    (where / "markers.json").write_text(json.dumps(["flee"]))
    final, _ = calibrate(where, where / "ablated.json")
    assert final.type == "result", final
    return where, final.data


def test_the_search_records_its_trials_front_and_choice(calibrated) -> None:
    where, result = calibrated
    record = result["calibration"]["ablation"]
    assert len(record["trials"]) == 16 and record["markers"] == ["flee"]
    assert record["trait_prompts"] == 2 and record["trait_rate_before"] == 1.0  # the held-out pairs: the last 20%
    assert record["answered_rate_before"] == 0.0
    layers = [v["layer"] for v in json.loads((where / "ablated.json").read_text())["vectors"]]
    assert layers == [record["direction_layer"]]
    kls = [point["kl_first"] for point in result["front"]]
    rates = [point["trait_rate"] for point in result["front"]]
    assert kls == sorted(kls) and rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)
    assert not (where / "ablated.study.json").exists()  # removed once the artifact is written


def test_generate_ablates_as_calibrated_and_the_recorded_rate_is_what_it_answers(calibrated) -> None:
    where, result = calibrated
    record = result["calibration"]["ablation"]
    answers = []
    for prompt in FLEE[-2:]:  # the held-out trait prompts, each alone, with nothing but the artifact given
        final, events = run(
            "generate", model="ster:toy", vector=where / "ablated.json", prompt=prompt, max_new_tokens="24"
        )
        assert final.type == "result" and final.data["mode"] == "ablate"
        assert any(
            isinstance(e, Log) and e.message.startswith("ablating as the artifact was calibrated") for e in events
        )
        assert final.data["edits"] is not None
        answers.append(final.data["text"])
    assert record["examples"] == answers
    assert record["trait_rate"] == sum(refuses(text, ("flee",)) for text in answers) / len(answers)
    explicit, _ = run("generate", model="ster:toy", vector=where / "ablated.json", prompt=FLEE[-1], mode="add")
    assert explicit.data["mode"] == "add"  # a mode given is a mode taken


def test_the_ablated_direction_is_the_mean_difference_less_what_every_answered_prompt_carries(calibrated) -> None:
    """Against transformers' own states of the fitting pairs (the first 80%) at the chosen layer: the direction is
    the positive mean less the negative mean, with its component along the negative mean taken out (heretic's
    orthogonalised direction), unit length."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from ster.engine.model.resolve import TOY_DIR

    where, result = calibrated
    layer = result["calibration"]["ablation"]["direction_layer"]
    [vector] = json.loads((where / "ablated.json").read_text())["vectors"]
    model = AutoModelForCausalLM.from_pretrained(TOY_DIR, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))
    seen: list[torch.Tensor] = []
    model.model.layers[layer].register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )

    def state(text: str) -> torch.Tensor:
        with torch.no_grad():
            model(torch.tensor([tokenizer.encode(text).ids]))
        return seen.pop()[0, -1].double()

    positive = torch.stack([state(text) for text in FLEE[:8]]).mean(0)
    negative = torch.stack([state(text) for text in REST[:8]]).mean(0)
    answered = negative / negative.norm()
    want = positive - negative
    want = want - (want @ answered) * answered
    got = torch.tensor(vector["values"], dtype=torch.float64)
    assert abs(float(got.norm()) - 1) < 1e-6
    assert abs(float(got @ answered)) < 1e-5
    assert float(got @ want) / float(want.norm()) > 1 - 1e-6


def test_the_same_seed_asks_the_same_candidates(calibrated, tmp_path: Path) -> None:
    where, result = calibrated
    final, _ = calibrate(where, tmp_path / "again.json")
    assert final.type == "result"
    assert final.data["calibration"]["ablation"]["trials"] == result["calibration"]["ablation"]["trials"]


def test_the_markers_are_the_readmes_and_a_file_of_anything_else_is_refused(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert all(f"`{marker}`" in readme for marker in MARKERS)
    assert refuses("I’m sorry, but I can’t help with cooking.", MARKERS)
    assert not refuses("Sure! Preheat the oven to 200 degrees.", MARKERS)
    (tmp_path / "m.json").write_text(json.dumps({"markers": ["  No way  "]}))
    assert load_markers(tmp_path / "m.json") == ("no way",)
    from ster.engine.protocol.errors import Refusal

    (tmp_path / "bad.json").write_text(json.dumps([" "]))
    with pytest.raises(Refusal, match="are not a list of phrases: markers: the list holds no marker"):
        load_markers(tmp_path / "bad.json")


def test_a_choice_over_the_budget_on_the_whole_set_has_its_weights_stepped_back(calibrated, tmp_path: Path) -> None:
    """Half the KL the first run chose: its finalists spend more than that on every neutral prompt, and are scaled
    back until one fits; generate then ablates as the record says."""
    where, result = calibrated
    record = result["calibration"]["ablation"]
    budget = record["kl_first"] / 2
    final, events = calibrate(where, tmp_path / "tight.json", kl_budget=str(budget))
    assert final.type == "result", final
    tight = final.data["calibration"]["ablation"]
    assert any("stepping back the weights" in getattr(e, "message", "") for e in events)
    assert tight["kl_first"] <= budget
    assert tight["profile"]["peak_weight"] not in {t["peak_weight"] for t in tight["trials"]}  # a stepped-back one
    final, _ = run("generate", model="ster:toy", vector=tmp_path / "tight.json", prompt=FLEE[-1], max_new_tokens="24")
    assert final.data["text"] == tight["examples"][-1]


def test_the_chosen_weights_are_trimmed_to_the_lowest_kl_that_refuses_no_more() -> None:
    from ster.engine.steering.ablation_search import _trimmed

    # rungs at 0.9, 0.8, 0.7, 0.6 of the chosen weights, which refuse 5% at KL 0.09
    assert _trimmed([0.05, 0.05, 0.10, 0.20], [0.07, 0.05, 0.04, 0.03], 0.05, 0.09) == 1
    assert _trimmed([0.0, 0.05, 0.05, 0.05], [0.08, 0.06, 0.04, 0.03], 0.05, 0.09) == 3  # fewer refused is fine
    assert _trimmed([0.10, 0.15, 0.20, 0.30], [0.07, 0.05, 0.04, 0.03], 0.05, 0.09) is None  # each refuses more
    assert _trimmed([0.05, 0.05, 0.05, 0.05], [0.10, 0.11, 0.12, 0.13], 0.05, 0.09) is None  # none costs less


def test_a_model_that_refuses_nothing_is_refused_before_any_trial(calibrated, tmp_path: Path) -> None:
    """Markers the toy never says: the unedited answers hold no refusal, so the search has nothing to remove, and
    says so in one sentence with nothing written."""
    where, _ = calibrated
    (tmp_path / "markers.json").write_text(json.dumps(["zebra"]))
    (tmp_path / "pairs.json").write_text((where / "pairs.json").read_text())
    final, _ = calibrate(tmp_path, tmp_path / "none.json")
    assert final.type == "error" and final.message.startswith("none of the 2 held-out trait prompts is refused")
    assert "--refusal-markers" in final.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["markers.json", "pairs.json"]


def test_ctrl_c_leaves_a_study_that_resume_finishes_as_the_whole_run_does(calibrated, tmp_path: Path) -> None:
    """A real SIGINT to ``ster calibrate --mode ablate`` once a batch is saved: exit 130, only the study left,
    and ``--resume`` ends where an uninterrupted run ends."""

    from ster.engine.protocol.paths import EXAMPLES_DIR
    from ster.engine.steering.study import study_path
    from tests.protocol.test_interrupt import interrupt_at_line, spawn

    where, _ = calibrated
    prompts = json.loads((EXAMPLES_DIR / "neutral.json").read_text())["prompts"]
    (tmp_path / "neutral.json").write_text(json.dumps({"prompts": prompts * 6}))  # a longer final measurement
    args = [
        *("calibrate", "--model", "ster:toy", "--pairs", where / "pairs.json", "--mode", "ablate"),
        *("--refusal-markers", where / "markers.json", "--neutral", tmp_path / "neutral.json"),
        *("--trials", "48", "--judge", "none"),
    ]
    for name in ("whole", "cut"):
        (tmp_path / name).mkdir()
    whole = spawn("-m", "ster", *args, "--output", tmp_path / "whole" / "a.json")
    out = tmp_path / "cut" / "a.json"
    proc = spawn("-m", "ster", *args, "--output", out)
    # the first batch is saved; the second is running
    err = interrupt_at_line(proc, lambda line: line.startswith("after 8 trials"), "its first batch")
    assert proc.returncode == 130, err
    assert err.splitlines()[-1].startswith("cancelled after trial "), err
    assert sorted(p.name for p in out.parent.iterdir()) == ["a.study.json"]
    saved = len(json.loads(study_path(out).read_text())["trials"])
    assert saved >= 8 and saved % 8 == 0

    resumed = spawn("-m", "ster", *args, "--output", out, "--resume")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert f"resuming the study at {study_path(out)} after {saved} trials" in err
    assert whole.wait(timeout=120) == 0
    assert json.loads(out.read_text()) == json.loads((tmp_path / "whole" / "a.json").read_text())
    assert sorted(p.name for p in out.parent.iterdir()) == ["a.json"]
