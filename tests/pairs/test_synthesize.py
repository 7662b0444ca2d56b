"""``ster pairs synthesize``: the loop on the local toy, and the Brama route against a real HTTP
server on 127.0.0.1 that behaves like the gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pairs.fake_brama import completion, serving

BEARER = "sekrit-bearer-0123456789"
ALLOWED = {"model", "messages", "max_tokens", "temperature"}


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


class Gateway:
    """A stand-in for Brama: validates the body the way the gateway does and answers from a script."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.reply: tuple[int, str] | None = None  # a scripted failure, else a completion
        self.calls = 0

    def answer(self, body: dict) -> tuple[int, str]:
        unknown = sorted(set(body) - ALLOWED)
        if unknown:
            return 400, json.dumps(
                {
                    "error": {
                        "message": f'unknown field "{unknown[0]}"',
                        "type": "invalid_request",
                        "code": "unknown_field",
                        "retryable": False,
                        "attempts": 1,
                    }
                }
            )
        if self.reply is not None:
            return self.reply
        self.calls += 1
        prompt = body["messages"][0]["content"]
        if prompt.startswith("In two to five words"):
            text = "anxious and alarmed"
        elif prompt.startswith("Write one short"):
            text = f"What do you do when train number {self.calls} is late?"
        elif "calm and unhurried" in prompt:
            text = f"I wait quietly and read a book; train {self.calls} will come when it comes."
        else:
            text = f"This is a disaster! Train {self.calls} is late and everything is ruined!"
        return 200, completion(text)


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    state = Gateway()

    with serving(state.answer, state.requests) as url:
        monkeypatch.setenv("BRAMA_URL", url)
        monkeypatch.setenv("BRAMA_BEARER", BEARER)
        yield state


def brama(cli, tmp_path: Path, *extra: str, count: str = "3"):
    return cli(
        "--json",
        "pairs",
        "synthesize",
        "--generator",
        "brama",
        "--generator-model",
        "openai/gpt-5-mini",
        "--trait",
        "calm and unhurried",
        "--count",
        count,
        "--output",
        tmp_path / "out.json",
        *extra,
    )


def test_the_brama_route_sends_exactly_the_documented_body(cli, tmp_path: Path, gateway: Gateway) -> None:
    run = brama(cli, tmp_path, "--max-new-tokens", "80", "--temperature", "0.7")
    assert run.code == 0, run.err
    report = run.events[-1]["data"]
    assert report["generator"] == "brama:openai/gpt-5-mini" and report["opposite"] == "anxious and alarmed"
    assert report["kept"] == 3 and report["attempts"] == 3 and report["requested"] == 3
    assert {
        k: report[k] for k in ("rejected_empty", "rejected_refusals", "rejected_duplicates", "refusal_retries")
    } == {"rejected_empty": 0, "rejected_refusals": 0, "rejected_duplicates": 0, "refusal_retries": 0}
    assert set(report["diversity"]) == {
        "unique_unigrams",
        "unique_bigrams",
        "avg_jaccard",
        "mean_simhash_hamming",
        "min_simhash_hamming",
    }
    first = gateway.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == f"Bearer {BEARER}"
    assert first["body"] == {
        "model": "openai/gpt-5-mini",
        "messages": [{"role": "user", "content": first["body"]["messages"][0]["content"]}],
        "max_tokens": 80,
        "temperature": 0.7,
    }
    assert all(set(r["body"]) == ALLOWED for r in gateway.requests)
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["trait_name"] == "calm-and-unhurried" and len(document["pairs"]) == 3
    assert document["pairs"][0]["positive"].startswith(
        "Question: What do you do when train number 2 is late?\nAnswer: I wait quietly"
    )
    progress = [e["message"] for e in run.events if e["type"] == "progress" and e["stage"] == "synthesize"]
    assert progress == [
        "synthesizing pair 1/3 (attempt 1)",
        "synthesizing pair 2/3 (attempt 2)",
        "synthesizing pair 3/3 (attempt 3)",
    ]
    kept = [e["data"] for e in run.events if e["type"] == "progress" and e["stage"] == "kept"]
    assert kept == document["pairs"]
    assert BEARER not in run.out + run.err


@pytest.mark.parametrize(
    ("status", "error", "sentence"),
    [
        (
            401,
            {"message": "unauthorized", "type": "auth", "code": "unauthenticated", "retryable": False, "attempts": 1},
            "brama refused the completion: 401 unauthorized",
        ),
        (
            426,
            {
                "message": "secure transport required",
                "type": "transport",
                "code": "secure_transport_required",
                "retryable": False,
                "attempts": 1,
            },
            "brama refused the completion: 426 secure transport required",
        ),
        (
            429,
            {"message": "rate limited", "type": "rate_limit", "code": "rate_limited", "retryable": True, "attempts": 3},
            "brama refused the completion: 429 rate limited",
        ),
        (
            400,
            {
                "message": 'unknown field "seed"',
                "type": "invalid_request",
                "code": "unknown_field",
                "retryable": False,
                "attempts": 1,
            },
            'brama refused the completion: 400 unknown field "seed"',
        ),
    ],
)
def test_gateway_refusals_are_surfaced_in_its_own_words(
    cli, tmp_path: Path, gateway: Gateway, status: int, error: dict, sentence: str
) -> None:
    gateway.reply = (status, json.dumps({"error": error}))
    run = brama(cli, tmp_path)
    assert run.code == 1
    final = run.events[-1]
    assert final["type"] == "error" and final["message"] == sentence
    assert final["details"] == {"status": status, **{k: error[k] for k in ("type", "code", "retryable", "attempts")}}
    assert not (tmp_path / "out.json").exists() and BEARER not in run.out + run.err


def test_a_body_without_the_envelope_is_quoted(cli, tmp_path: Path, gateway: Gateway) -> None:
    gateway.reply = (502, "<html><body>bad gateway</body></html>")
    run = brama(cli, tmp_path)
    assert run.code == 1 and run.events[-1]["message"] == (
        "brama refused the completion with 502 and a body that is not its error envelope: "
        "<html><body>bad gateway</body></html>"
    )


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"BRAMA_URL": "http://brama.example.com"},
            "BRAMA_URL must be an https:// base or an explicit http:// loopback address, because Brama answers plain http "
            "elsewhere with 426 secure_transport_required",
        ),
        (
            {"BRAMA_BEARER": ""},
            "BRAMA_BEARER is unset or empty; export Ster's own Brama bearer before running this command",
        ),
    ],
)
def test_environment_refusals_come_before_any_request(
    cli, tmp_path: Path, gateway: Gateway, monkeypatch: pytest.MonkeyPatch, env: dict, sentence: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run = brama(cli, tmp_path)
    assert run.code == 1 and run.events[-1]["message"] == sentence
    assert gateway.requests == [] and BEARER not in run.out + run.err


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (
            ["--generator", "cloud", "--trait", "x", "--count", "1"],
            'unknown generator "cloud"; expected local or brama',
        ),
        (["--trait", "x", "--count", "1"], "pairs synthesize with --generator local requires --model"),
        (
            ["--generator", "brama", "--trait", "x", "--count", "1"],
            "pairs synthesize with --generator brama requires --generator-model",
        ),
        (
            ["--generator", "brama", "--generator-model", "gpt 5", "--trait", "x", "--count", "1"],
            "the generator model must be a Brama alias, a canonical provider/model route, or a selector",
        ),
        (
            [
                "--generator",
                "brama",
                "--generator-model",
                "a/b",
                "--trait",
                "x",
                "--count",
                "1",
                "--max-new-tokens",
                "40000",
            ],
            "max_tokens must be between one and 32768",
        ),
        (
            ["--generator", "brama", "--generator-model", "a/b", "--trait", "x", "--count", "1", "--temperature", "3"],
            "temperature must be finite and between zero and 2",
        ),
        (
            ["--model", "ster:toy", "--trait", "x", "--count", "1", "--temperature", "0"],
            "synthesis requires a temperature above zero; argmax generation repeats a single prompt",
        ),
    ],
)
def test_argument_refusals(cli, tmp_path: Path, gateway: Gateway, flags: list[str], sentence: str) -> None:
    run = cli("--json", "pairs", "synthesize", *flags, "--output", tmp_path / "out.json")
    assert run.code == 1 and run.events[-1]["message"] == sentence
    assert not any(e["type"] == "progress" and e["stage"] == "load" for e in run.events)  # no model was loaded
    assert gateway.requests == [] and not (tmp_path / "out.json").exists()


def test_selectors_warn_that_they_need_a_signed_request(cli, tmp_path: Path, gateway: Gateway) -> None:
    run = cli(
        "--json",
        "pairs",
        "synthesize",
        "--generator",
        "brama",
        "--generator-model",
        "best",
        "--trait",
        "calm and unhurried",
        "--count",
        "1",
        "--output",
        tmp_path / "out.json",
    )
    assert run.code == 0
    assert any(e["type"] == "warning" and "agent-signed" in e["message"] for e in run.events)


def test_the_local_writer_advances_its_seed_every_call_and_reproduces() -> None:
    from ster.engine.pairs.requests import PairsSynthesizeRequest
    from ster.engine.pairs.synthesize import _local_writer
    from ster.engine.protocol.jobs import JobContext

    ctx = JobContext(lambda event: None)
    request = PairsSynthesizeRequest(
        trait="calm", count=1, output=Path("unused.json"), model="ster:toy", seed=7, temperature=1.0, max_new_tokens=12
    )
    first, identity = _local_writer(request, ctx)
    again, _ = _local_writer(request, ctx)
    texts = [first("question : what is the river like ? answer :") for _ in range(4)]
    assert identity == "local:ster:toy"
    assert [again("question : what is the river like ? answer :") for _ in range(4)] == texts
    assert len(set(texts)) > 1  # one fixed seed would return one continuation every call


def test_the_local_route_refuses_when_nothing_survives(cli, tmp_path: Path) -> None:
    """The toy writes no questions in English, so every attempt is empty: the run says so and writes nothing."""
    run = cli(
        "pairs",
        "synthesize",
        "--model",
        "ster:toy",
        "--trait",
        "calm",
        "--opposite",
        "alarmed",
        "--count",
        "2",
        "--retry-multiplier",
        "2",
        "--output",
        tmp_path / "a.json",
        "--max-new-tokens",
        "8",
    )
    assert run.code == 1
    assert run.err.strip().endswith(
        "synthesis kept no pairs in 4 attempts (4 empty, 0 refusing, 0 duplicate); nothing was written"
    )
    assert "synthesizing pair 1/2 (attempt 4)" in run.err and not (tmp_path / "a.json").exists()
