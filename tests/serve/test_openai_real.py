"""OpenAI's API on the real models: a fitted condition on SmolLM2, and Gemma 3's batch (``real`` marker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.real
FIT = Path(__file__).resolve().parent.parent / "data" / "calm-fit.json"
ALARMED = "Help! There is smoke pouring out of my kitchen and the alarm is screaming. What do I do?"
CALM = "Describe a quiet morning by a still lake."


def _fit(model: Path, output: Path, layers: str) -> None:
    from ster.cli import main

    assert (
        main(
            ["--json", "train", "--model", str(model), "--pairs", str(FIT), "--layers", layers, "--output", str(output)]
        )
        == 0
    )


def _generate(model: Path, prompt: str, n: int, **flags: str) -> str:
    from ster.engine.protocol.jobs import build_job_request, run_job

    request = build_job_request("generate", model=str(model), prompt=prompt, max_new_tokens=str(n), **flags)
    final = run_job("generate", request, lambda event: None)
    assert final.type == "result", final
    return str(final.data["text"])


def test_a_fitted_condition_steers_the_alarmed_prompt_and_leaves_the_calm_one(smol: Path, tmp_path: Path) -> None:
    """The calm direction, fitted on SmolLM2, as a CAST condition: the alarmed prompt measures lower along it than the
    calm one; with the threshold between them and ``<``, the alarmed prompt is steered calm (its text is ``ster
    generate``'s with the vector) and the calm prompt is left alone (its text is the unsteered one)."""
    vector = tmp_path / "calm.json"
    _fit(smol, vector, "12")
    server = start_server(tmp_path, "--model", str(smol))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)

        def ask(prompt: str, threshold: float, n: int) -> object:
            steering = {
                "vector": str(vector),
                "scale": "0.6x",
                "condition": {"vector": str(vector), "threshold": threshold, "comparator": "<"},
            }
            return client.chat.completions.create(
                model=str(smol),
                messages=[{"role": "user", "content": prompt}],
                max_tokens=n,
                temperature=0,
                extra_body={"steering": steering},
            )

        measures = {
            p: ask(p, 2.0, 1).model_extra["ster"]["steering"][0]["condition"][0]["measure"] for p in (ALARMED, CALM)
        }
        assert measures[ALARMED] < measures[CALM], measures
        threshold = (measures[ALARMED] + measures[CALM]) / 2

        async def both() -> list:
            async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as asynchronous:
                steering = {
                    "vector": str(vector),
                    "scale": "0.6x",
                    "condition": {"vector": str(vector), "threshold": threshold, "comparator": "<"},
                }
                return await asyncio.gather(
                    *(
                        asynchronous.chat.completions.create(
                            model=str(smol),
                            messages=[{"role": "user", "content": prompt}],
                            max_tokens=16,
                            temperature=0,
                            extra_body={"steering": steering},
                        )
                        for prompt in (ALARMED, CALM)
                    )
                )

        alarmed, calm = asyncio.run(both())
        assert alarmed.model_extra["ster"]["steering"][0]["condition"][0]["passed"] is True
        assert calm.model_extra["ster"]["steering"][0]["condition"][0]["passed"] is False
        steered = _generate(smol, ALARMED, 16, vector=str(vector), strength="0.6x")
        assert alarmed.choices[0].message.content == steered
        assert calm.choices[0].message.content == _generate(smol, CALM, 16)
        assert steered != _generate(smol, ALARMED, 16), "the calm vector should change the alarmed answer"
    finally:
        stop_server(server)
    assert "Traceback" not in server.stderr_text()


def test_gemma_completions_batched_with_steering_equal_generate_and_chat_is_refused(
    gemma: Path, tmp_path: Path
) -> None:
    """Gemma 3 270M (the base model, sliding-window layers, sandwich norms): two prompts of different lengths sent
    together, one steered and one ablated, each equal ``ster generate``; it has no chat template, so a chat request
    is refused in one sentence that says where to send the text."""
    vector = tmp_path / "calm.json"
    _fit(gemma, vector, "6")
    server = start_server(tmp_path, "--model", str(gemma))
    prompts = ["The lake this morning is", "Write one sentence about the town square, where the market opens at dawn:"]
    specs = [{"vector": str(vector), "scale": "0.5x"}, {"vector": str(vector), "mode": "ablate"}]
    flags = [{"vector": str(vector), "strength": "0.5x"}, {"vector": str(vector), "mode": "ablate"}]
    try:

        async def both() -> list:
            async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as asynchronous:
                return await asyncio.gather(
                    *(
                        asynchronous.completions.create(
                            model=str(gemma), prompt=p, max_tokens=12, temperature=0, extra_body={"steering": s}
                        )
                        for p, s in zip(prompts, specs, strict=True)
                    )
                )

        answers = asyncio.run(both())
        for prompt, flag, answer in zip(prompts, flags, answers, strict=True):
            assert answer.choices[0].text == _generate(gemma, prompt, 12, chat_template="off", **flag)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=str(gemma), messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert (
            "no chat template" in json.dumps(refused.value.body) and "/v1/completions" in refused.value.body["message"]
        )
    finally:
        stop_server(server)
    assert "Traceback" not in server.stderr_text()
