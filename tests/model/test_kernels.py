"""The CPU kernels of the decoder's projections, chosen by timing them (``ster.engine.model.kernels``).

Every candidate is checked against ``F.linear`` itself; the selector is driven by a fake timer that
makes each candidate win in turn, and the toy's logits and greedy tokens must not move; the cache must
measure again on another CPU, torch or thread count, and keep every entry when two processes write it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ster.engine.model import kernels
from ster.engine.model.config import load_config
from ster.engine.model.decoding import decode
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.model.sampling import Sampling
from ster.engine.protocol.errors import Refusal

REPO = Path(__file__).resolve().parents[2]
PRECISIONS = ("f32", "f16", "bf16", "int8")
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2, "int8": 1.6e-2}
"""Relative error of a product against F.linear's: the float order at f32, one rounding at half precision (and
the int8 kernel's bf16 input)."""


@pytest.fixture(autouse=True)
def fresh_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each test starts from the built-in table and its own cache directory, and leaves the table as it was."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("STER_KERNELS", raising=False)
    threads = torch.get_num_threads()
    kernels.table().reset()
    yield
    kernels.table().reset()
    torch.set_num_threads(threads)


def _toy(precision: str):
    source = resolve_model("ster:toy", None)
    return load_decoder(source, load_config(source.config), precision, torch.device("cpu"))


@pytest.fixture(scope="module")
def toys():
    return {precision: _toy(precision) for precision in PRECISIONS}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_candidate_computes_f_linears_product(toys, precision: str) -> None:
    model = toys[precision]
    weights = model.projections()
    dtype = torch.float32 if precision == "int8" else kernels.DTYPES[precision]
    generator = torch.Generator().manual_seed(1)
    tried = 0
    with torch.inference_mode():
        for shape, candidates in kernels.CANDIDATES[precision].items():
            rows = kernels.TIMED_ROWS[shape]
            for weight in (weights[0], weights[1], weights[-1]):  # q/k/v, o and the head: three shapes
                x = torch.randn(2, rows, weight.shape[1], generator=generator).to(dtype)
                reference = weight.dequantize() if precision == "int8" else weight.float()
                exact = F.linear(x.float(), reference)  # independently: f32, the weights as they are
                ours = F.linear(x, weight) if precision != "int8" else F.linear(x, reference)
                bias = torch.randn(weight.shape[0], generator=generator).to(dtype)
                for name in candidates:
                    y = kernels.KERNELS[name](x, weight, None)
                    assert y.shape == exact.shape and y.dtype == dtype, (shape, name)
                    assert _relative(y, exact) <= TOLERANCE[precision], (shape, name, _relative(y, exact))
                    assert _relative(y, ours) <= TOLERANCE[precision], (shape, name)
                    with_bias = kernels.KERNELS[name](x, weight, bias)
                    assert _relative(with_bias, exact + bias.float()) <= TOLERANCE[precision], (shape, name)
                    tried += 1
    assert tried == 3 * sum(len(c) for c in kernels.CANDIDATES[precision].values())


def _everything(model) -> dict[str, torch.Tensor | list]:
    """The toy's outputs through every class of rows: a prefill's logits (many), a four-token forward's (few), a
    greedy continuation (one row per step) and a group of four greedy rows (few rows per step)."""
    prompt = [1, 55, 18, 54, 32, 8, 40, 12, 9, 30, 21, 5]
    with torch.inference_mode():
        many = model(torch.tensor([prompt]), vocab="all").logits
        few = model(torch.tensor([prompt[:4]]), vocab="all").logits
    ids = decode(
        model,
        prompt,
        max_new_tokens=8,
        sampling=Sampling(),
        eos_ids=frozenset(),
        on_token=lambda i, t: None,
        check_cancelled=lambda: None,
    ).ids
    group = decode_group(
        model, prompt, [Sampling()] * 4, max_new_tokens=6, eos_ids=frozenset(), check_cancelled=lambda: None
    )
    return {"many": many, "few": few, "ids": ids, "group": [g.ids for g in group]}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_whichever_candidate_wins_the_logits_and_greedy_tokens_hold(toys, precision: str) -> None:
    model = toys[precision]
    reference = _everything(model)
    names = sorted({name for candidates in kernels.CANDIDATES[precision].values() for name in candidates})
    assert len(names) >= 2
    for favourite in names:

        def timer(shape: str, candidate: str, run, favourite: str = favourite) -> float:
            run()  # each candidate still runs on the real weights
            return 0.001 if candidate == favourite else 1.0

        chosen = kernels.choose(model.projections(), precision, timer, how="measure")
        for shape, candidates in kernels.CANDIDATES[precision].items():
            assert chosen.choice[shape] == (favourite if favourite in candidates else chosen.choice[shape])
            assert kernels.table().names[precision] == chosen.choice
        got = _everything(model)
        assert got["ids"] == reference["ids"] and got["group"] == reference["group"], favourite
        assert all(row == reference["ids"][:6] for row in got["group"])  # a greedy row is the lone row's
        for key in ("many", "few"):
            assert _relative(got[key], reference[key]) <= TOLERANCE[precision], (favourite, key)


def test_the_fastest_wins_and_a_hopeless_candidate_is_not_timed_again(toys) -> None:
    weights = toys["bf16"].projections()
    calls: list[tuple[str, str]] = []
    cost = {"linear": 3.0, "native": 1.0, "wxt": 10.0, "upcast": 2.0}

    def timer(shape: str, candidate: str, run) -> float:
        calls.append((shape, candidate))
        return cost[candidate]

    choice, times = kernels.measure(weights, "bf16", timer)
    assert choice == {"one": "native", "few": "native", "batch": "native", "many": "native"}
    assert times["one"] == {"linear": 3.0, "native": 1.0, "wxt": 10.0}
    for shape in ("one", "few", "batch", "many"):
        assert calls.count((shape, "native")) == kernels.ROUNDS
        assert calls.count((shape, "linear")) == 1  # 3x the best first pass: more than GIVE_UP
    assert calls.count(("one", "wxt")) == 1


def test_the_cache_measures_again_on_another_cpu_torch_or_thread_count(toys, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = toys["f32"].projections()
    timed: list[str] = []

    def timer(shape: str, candidate: str, run) -> float:
        timed.append(candidate)
        return {"linear": 1.0, "wxt": 2.0}[candidate]

    def timings() -> int:
        before = len(timed)
        chosen = kernels.choose(weights, "f32", timer, how="cached")
        assert chosen.choice == {"one": "linear", "few": "linear", "batch": "linear", "many": "linear"}
        return len(timed) - before

    assert timings() > 0  # nothing cached: measured
    assert timings() == 0  # the same machine: cached
    path = kernels.cache_path()
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 1
    (entry,) = entries.values()
    assert entry["precision"] == "f32" and entry["threads"] == torch.get_num_threads()
    assert entry["torch"] == torch.__version__ and entry["choice"]["one"] == "linear"

    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    assert timings() > 0  # another thread count
    torch.set_num_threads(threads)
    assert timings() == 0
    real = kernels.cpu_description()
    monkeypatch.setattr(kernels, "cpu_description", lambda: ("Another CPU", real[1]))
    assert timings() > 0  # another CPU model
    monkeypatch.setattr(kernels, "cpu_description", lambda: (real[0], [*real[1], "amx_fp16"]))
    assert timings() > 0  # the same name with other instruction sets
    monkeypatch.setattr(kernels, "cpu_description", lambda: real)
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert timings() > 0  # another torch
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(path.parent.parent))
    assert timings() == 0  # every entry kept beside the others
    assert len(json.loads(path.read_text())["entries"]) == 5
    other = kernels.cache_key("f32", weights[:-1], threads)  # another model's shapes
    assert other != kernels.cache_key("f32", weights, threads)
    assert kernels.cache_key("bf16", weights, threads) != kernels.cache_key("f32", weights, threads)


def test_a_cached_choice_that_names_no_candidate_is_measured_again(toys) -> None:
    weights = toys["f32"].projections()
    path = kernels.cache_path()
    path.parent.mkdir(parents=True)
    key = kernels.cache_key("f32", weights, torch.get_num_threads())
    path.write_text(json.dumps({"schema": 1, "entries": {key: {"choice": {"one": "fast", "few": "wxt", "many": 1}}}}))
    assert kernels.choose(weights, "f32", lambda s, c, run: 1.0).how == "measured"
    path.write_text("{not json")
    assert kernels.choose(weights, "f32", lambda s, c, run: 1.0).how == "measured"
    assert kernels.choose(weights, "f32", lambda s, c, run: 1.0).how == "cached"


def test_an_unwritable_cache_still_uses_what_it_measured(toys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    chosen = kernels.choose(toys["f32"].projections(), "f32", lambda s, c, run: {"linear": 2.0, "wxt": 1.0}[c])
    assert chosen.how == "measured" and chosen.path is None and chosen.choice["one"] == "wxt"
    assert kernels.table().names["f32"]["one"] == "wxt"
    assert "kept in" not in chosen.sentence()
    assert blocker.read_text() == "not a directory"


def test_default_neither_times_nor_writes(toys) -> None:
    chosen = kernels.choose(toys["f32"].projections(), "f32", lambda s, c, run: pytest.fail("timed"), how="default")
    assert chosen.how == "default" and not kernels.cache_path().exists()


def test_a_bad_mode_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STER_KERNELS", "fastest")
    with pytest.raises(Refusal, match="^STER_KERNELS is 'fastest'; give measure, cached or default$"):
        kernels.mode()


def _ster(tmp_path: Path, mode: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "STER_KERNELS"}
    env |= {"PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    if mode is not None:
        env["STER_KERNELS"] = mode
    return subprocess.run(
        [sys.executable, "-m", "ster", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_ster_measures_once_per_machine_and_says_so_once(tmp_path: Path) -> None:
    generate = ["generate", "--model", "ster:toy", "--prompt", "the sea is", "--max-new-tokens", "4"]
    cache = tmp_path / "cache" / "ster" / "kernels.json"
    said = "timed the CPU kernels of f32 products on this machine in "

    first = _ster(tmp_path, None, *generate)  # the default mode, cached: nothing cached yet, so it measures
    assert first.returncode == 0, first.stderr
    assert first.stderr.count(said) == 1 and f"kept in {cache} for this CPU, torch and thread count" in first.stderr
    assert len(json.loads(cache.read_text())["entries"]) == 1

    second = _ster(tmp_path, "cached", *generate)
    assert second.returncode == 0 and said not in second.stderr
    assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]

    again = _ster(tmp_path, "measure", *generate)
    assert again.returncode == 0 and again.stderr.count(said) == 1

    cache.unlink()
    plain = _ster(tmp_path, "default", *generate)
    assert plain.returncode == 0 and said not in plain.stderr and not cache.exists()

    bad = _ster(tmp_path, "always", *generate)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[-1] == "error: STER_KERNELS is 'always'; give measure, cached or default"
    assert "loading" not in bad.stderr  # refused before a weight is read


def test_the_physical_floor_reads_memory_at_a_plausible_rate() -> None:
    bandwidth = kernels.read_bandwidth(megabytes=64, passes=2)
    assert 1e8 < bandwidth < 1e13  # 0.1 GB/s to 10 TB/s: a number, not a timer's artefact


@pytest.mark.real
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_on_smollm2_whichever_candidate_wins_the_greedy_text_and_logits_hold(smol: Path, precision: str) -> None:
    """The same check on the real model's shapes, where the candidates really differ in float order.

    Over 30 layers at bf16 two correct kernels differ by about 2% in the logits (the f32 upcast is the
    more exact of them), so at bf16 each candidate is measured against the f32 model instead: none may
    stand further from it than twice the default kernel does."""
    source = resolve_model(str(smol), None)
    prompt = [1, 504, 3575, 282, 4649, 314, 30, 2, 1, 9519, 9531, 198, 504, 3575, 282]

    def outputs(model: object) -> tuple[list[int], torch.Tensor]:
        with torch.inference_mode():
            logits = model(torch.tensor([prompt]), vocab="all").logits.float()
        ids = decode(
            model,
            prompt,
            max_new_tokens=12,
            sampling=Sampling(),
            eos_ids=frozenset(),
            on_token=lambda i, t: None,
            check_cancelled=lambda: None,
        ).ids
        return ids, logits

    model = load_decoder(source, load_config(source.config), precision, torch.device("cpu"))
    reference_ids, reference_logits = outputs(model)
    exact = reference_logits
    allowed = TOLERANCE[precision]
    if precision != "f32":
        kernels.choose(model.projections(), "f32", lambda shape, candidate, run: 1.0, how="default")
        exact = outputs(load_decoder(source, load_config(source.config), "f32", torch.device("cpu")))[1]
        allowed = max(TOLERANCE[precision], 2 * _relative(reference_logits, exact))
    names = sorted({name for candidates in kernels.CANDIDATES[precision].values() for name in candidates})
    for favourite in names:
        kernels.choose(
            model.projections(),
            precision,
            lambda shape, candidate, run, favourite=favourite: 0.001 if candidate == favourite else 1.0,
            how="measure",
        )
        ids, logits = outputs(model)
        assert ids == reference_ids, favourite
        assert _relative(logits, exact) <= allowed, favourite
