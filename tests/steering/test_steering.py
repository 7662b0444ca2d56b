"""The steering loop on the toy checkpoint: fitting against independent computations, selection,
steered generation against a reference hook on transformers' model, and every refusal."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ster.engine.model.loading import ModelStore, model_store
from ster.engine.model.resolve import EXAMPLES_DIR, TOY_DIR
from ster.engine.protocol.jobs import JobContext, run_job
from ster.engine.steering.activations import read_last_states, read_pair_states
from ster.engine.steering.directions import LOGISTIC_L2
from ster.engine.steering.requests import GenerateRequest, OptimizeRequest, TrainRequest

PAIRS = EXAMPLES_DIR / "pairs.json"
PROMPT = "question : tell me about the town . answer :"


@pytest.fixture(scope="module")
def reference_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TOY_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference_states(reference_model):
    """Per pair side, the last token's state after every block, from transformers (independent of Ster's decoder)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))
    captured: list[torch.Tensor] = []
    handle = reference_model.model.layers[-1].register_forward_hook(
        lambda m, a, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )

    def read(text: str) -> np.ndarray:
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            hidden = reference_model(ids, output_hidden_states=True).hidden_states
        layers = [hidden[i + 1][0, -1] for i in range(len(hidden) - 2)] + [captured[-1][0, -1]]
        return torch.stack(layers).double().numpy()  # [L, D]

    pairs = json.loads(PAIRS.read_text())["pairs"]
    try:
        return np.stack([read(p["positive"]) for p in pairs]), np.stack([read(p["negative"]) for p in pairs])
    finally:
        handle.remove()


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def reference_direction(method: str, pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Each method computed with numpy alone, from the definitions in the README."""
    diffs = pos - neg
    if method == "caa":
        return unit(diffs.mean(0))
    if method == "pca":
        _, _, vt = np.linalg.svd(diffs - diffs.mean(0), full_matrices=False)
        return vt[0] if vt[0] @ diffs.mean(0) > 0 else -vt[0]
    x = np.concatenate([pos, neg])
    y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    x = x - x.mean(0)
    x = x / np.linalg.norm(x, axis=1).mean()
    xb = np.hstack([x, np.ones((len(x), 1))])  # Newton's method on [w, b]
    theta = np.zeros(xb.shape[1])
    penalty = np.diag([LOGISTIC_L2] * x.shape[1] + [0.0])
    for _ in range(100):
        p = 1 / (1 + np.exp(-xb @ theta))
        gradient = xb.T @ (p - y) / len(y) + penalty @ theta
        hessian = (xb.T * (p * (1 - p))) @ xb / len(y) + penalty
        theta -= np.linalg.solve(hessian, gradient)
    return unit(theta[:-1])


def train(cli, tmp_path: Path, *extra: str, name: str = "vector.json", pairs: Path = PAIRS) -> tuple:
    out = tmp_path / name
    run = cli("train", "--model", "ster:toy", "--pairs", pairs, "--output", out, *extra)
    return run, out


@pytest.mark.parametrize("method", ["caa", "pca", "logistic"])
def test_each_method_equals_an_independent_computation(cli, tmp_path: Path, reference_states, method: str) -> None:
    run, out = train(cli, tmp_path, "--method", method)
    assert run.code == 0, run.err
    artifact = json.loads(out.read_text())
    pos, neg = reference_states
    assert [v["layer"] for v in artifact["vectors"]] == [0, 1, 2, 3]
    for entry in artifact["vectors"]:
        layer = entry["layer"]
        expected = reference_direction(method, pos[:, layer], neg[:, layer])
        np.testing.assert_allclose(entry["values"], expected, atol=1e-5)
        gaps = pos[:, layer] @ expected - neg[:, layer] @ expected
        assert entry["train_accuracy"] == pytest.approx((gaps > 0).mean())
        assert entry["train_margin"] == pytest.approx(gaps.mean(), rel=1e-5)
        norms = np.linalg.norm(np.concatenate([pos[:, layer], neg[:, layer]]), axis=1).mean()
        assert entry["activation_norm"] == pytest.approx(norms, rel=1e-5)
    summary = run.json
    assert summary["method"] == method and summary["chat_template"] == "absent" and summary["precision"] == "f32"
    assert all(abs(layer["norm"] - 1) < 1e-6 and layer["width"] == 64 for layer in summary["layers"])
    assert not any("values" in layer for layer in summary["layers"])  # the summary carries no direction
    assert "values" not in json.dumps(summary)


def test_evaluate_on_the_training_set_reproduces_train(cli, tmp_path: Path) -> None:
    run, out = train(cli, tmp_path, "--method", "logistic", "--layers", "1,3")
    evaluated = cli("evaluate", "--model", "ster:toy", "--pairs", PAIRS, "--vector", out)
    assert evaluated.code == 0, evaluated.err
    result = evaluated.json
    assert result["pair_count"] == 12
    trained = {layer["layer"]: layer for layer in run.json["layers"]}
    for layer in result["layers"]:
        assert layer["accuracy"] == trained[layer["layer"]]["train_accuracy"]
        assert layer["margin"] == trained[layer["layer"]]["train_margin"]


def test_optimize_ranks_on_separation_and_refits_like_train(cli, tmp_path: Path, reference_states) -> None:
    out = tmp_path / "best.json"
    run = cli("optimize", "--model", "ster:toy", "--pairs", PAIRS, "--output", out)
    assert run.code == 0, run.err
    result = run.json
    selection = result["selection"]
    assert selection["holdout"] == {"fit_pairs": 9, "holdout_pairs": 3}
    rows = selection["candidates"]
    assert [(r["layer"], r["method"]) for r in rows] == [
        (layer, m) for layer in range(4) for m in ("caa", "pca", "logistic")
    ]
    chosen = [r for r in rows if r["selected"]]
    assert len(chosen) == 1
    best = max(rows, key=lambda r: (r["holdout_accuracy"], r["holdout_separation"], r["relative_margin"]))
    assert chosen[0] == best
    # the raw margin grows with depth and would pick the last layer; separation picks one that steers
    assert max(rows, key=lambda r: (r["holdout_accuracy"], r["holdout_margin"]))["layer"] == 3
    assert (best["layer"], best["method"]) == (2, "logistic")
    assert result["metadata"] == {
        "selection": "chosen over 12 candidates on a 3-pair holdout, then refitted on all 12 pairs"
    }
    refit = json.loads(out.read_text())
    assert refit["method"] == best["method"] and [v["layer"] for v in refit["vectors"]] == [best["layer"]]
    _, trained = train(cli, tmp_path, "--method", best["method"], "--layers", str(best["layer"]), name="t.json")
    assert json.loads(trained.read_text())["vectors"] == refit["vectors"]


def test_each_candidates_numbers_equal_an_independent_computation(cli, tmp_path: Path, reference_states) -> None:
    """holdout_margin, holdout_separation (margin over the pooled within-side spread of the holdout projections)
    and relative_margin (margin over the fitting states' mean norm), from numpy alone."""
    rows = cli("optimize", "--model", "ster:toy", "--pairs", PAIRS, "--output", tmp_path / "o.json").json
    pos, neg = reference_states
    for row in rows["selection"]["candidates"]:
        layer = row["layer"]
        v = reference_direction(row["method"], pos[:9, layer], neg[:9, layer])
        a, b = pos[9:, layer] @ v, neg[9:, layer] @ v
        margin = (a - b).mean()
        spread = np.sqrt((((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / (2 * 3 - 2))
        norm = np.linalg.norm(np.concatenate([pos[:9, layer], neg[:9, layer]]), axis=1).mean()
        assert row["holdout_margin"] == pytest.approx(margin, rel=1e-4, abs=1e-6)
        assert row["holdout_separation"] == pytest.approx(margin / spread, rel=1e-3)
        assert row["relative_margin"] == pytest.approx(margin / norm, rel=1e-4, abs=1e-6)


def test_a_one_pair_holdout_has_no_separation_and_ranks_on_relative_margin(cli, tmp_path: Path) -> None:
    pairs = json.loads(PAIRS.read_text())
    small = tmp_path / "four.json"
    small.write_text(json.dumps({**pairs, "pairs": pairs["pairs"][:4]}))
    rows = cli("optimize", "--model", "ster:toy", "--pairs", small, "--output", tmp_path / "o.json").json
    candidates = rows["selection"]["candidates"]
    assert all(r["holdout_separation"] is None for r in candidates)
    chosen = next(r for r in candidates if r["selected"])
    assert chosen == max(candidates, key=lambda r: (r["holdout_accuracy"], r["relative_margin"]))


def test_optimize_reads_the_pairs_once(tmp_path: Path) -> None:
    """All candidates reuse one read: optimize runs as many forward passes as train over the same layers."""
    store = ModelStore()
    calls = {"n": 0}
    sink = lambda event: None  # noqa: E731

    def count(kind: str, request) -> int:
        ctx = JobContext(sink, models=store)
        model = store.decoder(store.open(request, ctx), ctx)
        calls["n"] = 0
        handle = model.blocks[0].register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
        try:
            final = run_job(kind, request, sink, models=store)
            assert final.type == "result", final
        finally:
            handle.remove()
        return calls["n"]

    trained = count("train", TrainRequest(model="ster:toy", pairs=PAIRS, output=tmp_path / "t.json"))
    optimized = count("optimize", OptimizeRequest(model="ster:toy", pairs=PAIRS, output=tmp_path / "o.json"))
    assert optimized == trained > 0


def test_a_one_pair_holdout_warns(cli, tmp_path: Path) -> None:
    pairs = json.loads(PAIRS.read_text())
    small = tmp_path / "four.json"
    small.write_text(json.dumps({**pairs, "pairs": pairs["pairs"][:4]}))
    run = cli("optimize", "--model", "ster:toy", "--pairs", small, "--output", tmp_path / "o.json")
    assert run.code == 0
    assert (
        "warning: a one-pair holdout scores every candidate 0 or 1, so this ranking separates almost nothing; "
        "add pairs to make the choice mean something"
    ) in run.err
    assert "fitting each candidate on 3 pairs and ranking on a 1-pair holdout" in run.err


def test_pair_prefix_sharing_reads_what_a_whole_sequence_read_does() -> None:
    ctx = JobContext(lambda event: None)
    checkpoint = model_store(ctx).open(GenerateRequest(model="ster:toy", prompt="x"), ctx)
    model = model_store(ctx).decoder(checkpoint, ctx)
    pairs = json.loads(PAIRS.read_text())["pairs"]
    encoded = [
        (checkpoint.codec.encode_prompt(p["positive"]), checkpoint.codec.encode_prompt(p["negative"])) for p in pairs
    ]
    encoded.append(([1, 5, 6, 7], [1, 5, 6, 7]))  # identical sides
    encoded.append(([1, 9], [4, 9, 10, 11, 12]))  # nothing shared
    pos, neg = read_pair_states(model, encoded, [0, 3], batch_size=5)
    whole = read_last_states(model, [side for pair in encoded for side in pair], [0, 3], batch_size=3)
    torch.testing.assert_close(pos, whole[0::2], atol=1e-5, rtol=0)
    torch.testing.assert_close(neg, whole[1::2], atol=1e-5, rtol=0)


def reference_steered_greedy(
    reference_model, prompt_ids: list[int], layer: int, addition: torch.Tensor, steps: int, eos: int
) -> list[int]:
    """Greedy decoding by full recomputation, steering with a forward hook on transformers' own block."""

    def hook(module, args, output):
        if isinstance(output, tuple):
            return (output[0] + addition, *output[1:])
        return output + addition

    handle = reference_model.model.layers[layer].register_forward_hook(hook)
    ids = list(prompt_ids)
    try:
        with torch.no_grad():
            for _ in range(steps):
                token = int(reference_model(torch.tensor([ids])).logits[0, -1].argmax())
                if token == eos:
                    break
                ids.append(token)
    finally:
        handle.remove()
    return ids[len(prompt_ids) :]


def test_steered_generation_equals_a_reference_hook(cli, tmp_path: Path, reference_model) -> None:
    _, vector = train(cli, tmp_path, "--layers", "2")
    baseline = cli("generate", "--model", "ster:toy", "--prompt", PROMPT).json
    steered = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", vector, "--strength", "3").json
    assert steered["text"] != baseline["text"]
    assert steered["strength"] == 3.0 and steered["vector"] == str(vector)
    norm = json.loads(vector.read_text())["vectors"][0]["activation_norm"]
    assert steered["relative_strength"] == {"2": pytest.approx(3.0 / norm)}
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOY_DIR / "tokenizer.json"))
    direction = torch.tensor(json.loads(vector.read_text())["vectors"][0]["values"])
    expected = reference_steered_greedy(reference_model, tokenizer.encode(PROMPT).ids, 2, 3.0 * direction, 128, 2)
    assert steered["text"] == tokenizer.decode(expected)
    negative = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", vector, "--strength=-3").json
    expected = reference_steered_greedy(reference_model, tokenizer.encode(PROMPT).ids, 2, -3.0 * direction, 128, 2)
    assert negative["text"] == tokenizer.decode(expected)


def test_strength_zero_reproduces_the_baseline(cli, tmp_path: Path) -> None:
    _, vector = train(cli, tmp_path)
    for prompt in (PROMPT, "the sea is", "question : what is the river like ? answer :"):
        baseline = cli("generate", "--model", "ster:toy", "--prompt", prompt, "--temperature", "0.8").json
        zero = cli(
            "generate",
            "--model",
            "ster:toy",
            "--prompt",
            prompt,
            "--temperature",
            "0.8",
            "--vector",
            vector,
            "--strength",
            "0",
        ).json
        assert zero["text"] == baseline["text"] and zero["tokens"] == baseline["tokens"]


ALARMED = [
    "question : tell me about the town . answer :",
    "question : tell me about the forest . answer :",
    "question : how is the market today ? answer :",
    "question : tell me about the bridge . answer :",
    "question : tell me about the hill . answer :",
    "question : tell me about the park . answer :",
]
"""Six toy prompts whose unsteered answers are alarmed, so pushing toward calm has somewhere to go."""


def test_sweep_reports_every_strength_and_suggests_per_sign(cli, tmp_path: Path) -> None:
    _, vector = train(cli, tmp_path, "--layers", "3")
    prompts = tmp_path / "alarmed.json"
    prompts.write_text(json.dumps({"prompts": ALARMED}))
    run = cli(
        "--json",
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        prompts,
        "--strengths=-12,-4,4,8",
        "--max-new-tokens",
        "16",
    )
    assert run.code == 0
    events = run.events
    result = events[-1]["data"]
    rows = {r["strength"]: r for r in result["rows"]}
    assert list(rows) == [-12, -4, 0, 4, 8]
    base = rows[0]
    assert base["effect"] == 0 and base["changed"] == 0 and base["fluent"] and base["relative_strength"] == {"3": 0.0}
    assert all(len(r["outputs"]) == 6 for r in rows.values())
    for strength in (4, 8):  # pushing toward calm reads as calmer, on every prompt that changed
        row = rows[strength]
        assert row["distinguishable"] and row["effect"] > row["threshold"] > 0
        assert all(o["effect"] >= 0 for o in row["outputs"])
        assert row["effect"] == pytest.approx(sum(o["effect"] for o in row["outputs"]) / 6)
        assert row["relative_effect"] == pytest.approx(
            row["effect"] / json.loads(vector.read_text())["vectors"][0]["activation_norm"]
        )
    assert rows[8]["outputs"][0]["text"] == "the town is gentle and still."
    # -12 breaks the answers into "the is flooding today.", which loses the "we flee" the direction reads most
    # alarm in: a distinguishable effect on the wrong side, never suggested
    assert rows[-12]["distinguishable"] and rows[-12]["effect"] > 0
    assert not rows[-4]["distinguishable"]
    assert result["suggested"] == {"positive": 8, "negative": None} and result["moved"]
    assert not [e for e in events if e["type"] == "warning"]
    streams = {e["stream"] for e in events if e["type"] == "token"}
    assert "+4/0" in streams and "-12/5" in streams and "+0/1" in streams


def test_an_effect_carried_by_one_changed_text_is_noise(cli, tmp_path: Path) -> None:
    """At -0.3x on the example prompts only the fourth text changes, and it happens to read calmer: one changed
    text is exactly one standard error from 0, so it is neither distinguishable nor suggested, and a warning
    says that nothing moved."""
    _, vector = train(cli, tmp_path, "--layers", "3")
    run = cli(
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        EXAMPLES_DIR / "prompts.json",
        "--strengths=-0.3x,0.3x",
    )
    assert run.code == 0, run.err
    result = run.json
    low = result["rows"][0]
    assert low["strength"] == -0.3 and low["changed"] == 1 and low["effect"] > 0
    assert [o["effect"] == 0 for o in low["outputs"]] == [True, True, True, False]
    assert low["noise"] == pytest.approx(low["effect"]) and not low["distinguishable"]
    assert result["suggested"] == {"positive": None, "negative": None} and not result["moved"]
    assert "warning: no strength moved the text distinguishably from its noise: the largest effect" in run.err
    assert "in the residual stream's units (positive: toward calm)" in run.err  # what effect means, said once
    assert f"-0.3x: effect {low['effect']:+.3g} (" in run.err and "not distinguishable; 1/4 texts changed" in run.err


def test_sweep_without_strengths_walks_the_default_relative_sweep(cli, tmp_path: Path) -> None:
    from ster.engine.steering.strength import DEFAULT_SWEEP, parse_strengths

    _, vector = train(cli, tmp_path, "--layers", "2")
    run = cli(
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        EXAMPLES_DIR / "prompts.json",
        "--max-new-tokens",
        "8",
    )
    assert run.code == 0, run.err
    result = run.json
    assert result["strength_unit"] == "relative"
    expected = sorted({s.value for s in parse_strengths(DEFAULT_SWEEP)} | {0.0})
    assert [row["strength"] for row in result["rows"]] == expected
    spread = json.loads(vector.read_text())["vectors"][0]["activation_spread"]
    assert result["rows"][-1]["absolute_strength"] == {"2": pytest.approx(expected[-1] * spread)}


def test_a_strength_past_ten_activation_norms_warns(cli, tmp_path: Path) -> None:
    _, vector = train(cli, tmp_path, "--layers", "3")
    run = cli(
        "generate",
        "--model",
        "ster:toy",
        "--prompt",
        PROMPT,
        "--vector",
        vector,
        "--strength",
        "1e30",
        "--max-new-tokens",
        "4",
    )
    assert run.code == 0, run.err
    norm = json.loads(vector.read_text())["vectors"][0]["activation_norm"]
    assert (
        f"warning: strength 1e+30 is {1e30 / norm:.3g} times layer 3's activation norm ({norm:.4g}); past 10 "
        f"times the norm the direction drowns out the residual stream and the text is noise rather than "
        f"steered"
    ) in run.err
    assert (
        "activation norm"
        not in cli(
            "generate",
            "--model",
            "ster:toy",
            "--prompt",
            PROMPT,
            "--vector",
            vector,
            "--strength",
            "9x",
            "--max-new-tokens",
            "4",
        ).err
    )
    swept = cli(
        "sweep",
        "--model",
        "ster:toy",
        "--vector",
        vector,
        "--prompts",
        EXAMPLES_DIR / "prompts.json",
        "--strengths=-11x,-1x,1x",
        "--max-new-tokens",
        "4",
    )
    assert swept.code == 0 and swept.err.count("times layer 3's activation norm") == 1
    spread = json.loads(vector.read_text())["vectors"][0]["activation_spread"]  # what 1x is: the spread
    assert f"warning: strength -11x is {11 * spread / norm:.3g} times layer 3's activation norm" in swept.err


def test_a_strength_without_a_vector_warns_and_the_default_strength_is_relative(cli, tmp_path: Path) -> None:
    from ster.engine.steering.strength import DEFAULT_STRENGTH, Strength

    run = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--strength", "3", "--max-new-tokens", "4")
    assert run.code == 0
    assert "warning: --strength 3 has no effect without --vector: this run is the unsteered baseline" in run.err
    assert run.json["strength"] is None and run.json["vector"] is None
    assert "no effect" not in cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--max-new-tokens", "4").err
    _, vector = train(cli, tmp_path, "--layers", "2")
    steered = cli("generate", "--model", "ster:toy", "--prompt", PROMPT, "--vector", vector, "--max-new-tokens", "8")
    default = Strength.model_validate(DEFAULT_STRENGTH)
    assert (steered.json["strength"], steered.json["strength_unit"]) == (default.value, default.unit)
    layer = json.loads(vector.read_text())["vectors"][0]  # 1x is the layer's spread; relative is over its norm
    assert steered.json["relative_strength"] == {
        "2": pytest.approx(default.value * layer["activation_spread"] / layer["activation_norm"])
    }
    assert "no effect" not in steered.err


def test_sweep_measures_degeneracy() -> None:
    from ster.engine.steering.sweep import distinct_2, longest_run

    assert distinct_2([1, 2, 1, 2, 1, 2]) == pytest.approx(2 / 5)
    assert distinct_2([7]) is None
    assert longest_run([3, 4, 4, 4, 5, 4]) == 3 and longest_run([]) == 0


def test_vector_aliases(cli, tmp_path: Path) -> None:
    run = cli(
        "vector", "train", "--model", "ster:toy", "--pairs", PAIRS, "--output", tmp_path / "v.json", "--layers", "1"
    )
    assert run.code == 0 and (tmp_path / "v.json").exists()
    assert cli("vector", "inspect", tmp_path / "v.json").json["layers"][0]["layer"] == 1


def test_cancelled_training_writes_nothing(tmp_path: Path) -> None:
    cancel = threading.Event()

    def sink(event) -> None:
        if event.type == "progress" and event.stage == "fit":
            cancel.set()

    out = tmp_path / "never.json"
    final = run_job("train", TrainRequest(model="ster:toy", pairs=PAIRS, output=out), sink, cancel)
    assert final.type == "error" and final.kind == "cancelled"
    assert list(tmp_path.iterdir()) == []
