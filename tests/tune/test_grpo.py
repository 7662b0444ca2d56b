"""``ster tune grpo`` on the toy: the identity, the report, every refusal, the seeds, resume, reward models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ster.engine.model.group_decoding import decode_group
from ster.engine.model.loading import model_store
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune import grpo
from ster.engine.tune.grpo import Grpo, advantages
from ster.engine.tune.objectives import Unit
from ster.engine.tune.requests import GrpoRequest
from tests.tune.test_resume import files, killed_after_checkpoint

BASE = ["tune", "grpo", "--model", "ster:toy", "--prompts", "ster:grpo-prompts", "--max-new-tokens", "8"]
SUBJECT = "group-relative policy optimization"
REPORT = [
    "reward",
    "prompts",
    "trained_prompts",
    "skipped_long",
    "group",
    "iterations",
    "steps",
    "beta",
    "trainable_tensors",
    "trainable_parameters",
    "first_loss",
    "final_loss",
    "mean_reward",
    "mean_kl",
    "policy_loss",
    "max_new_tokens",
    "temperature",
    "top_p",
    "seed",
    "rank",
    "alpha",
    "targets",
    "layers",
    "learning_rate",
    "accumulation",
    "chat_template",
    "precision",
]
HISTORY = [
    "iteration",
    "groups",
    "completions",
    "mean_reward",
    "reward_spread",
    "mean_kl",
    "policy_loss",
    "mean_completion_tokens",
]


def test_advantages_are_standardised_within_the_group_without_epsilon() -> None:
    assert advantages([3.0, 3.0, 3.0]) == [0.0, 0.0, 0.0]
    values = advantages([1.0, 2.0, 3.0, 6.0])
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 4)  # population std
    assert values == [(r - 3.0) / std for r in (1.0, 2.0, 3.0, 6.0)]
    assert advantages([2.0, 2.0 + 2**-20]) == [-1.0, 1.0]  # no epsilon: a tiny spread still standardises


def test_the_first_loss_is_exactly_zero_and_the_report_has_every_field(cli, tmp_path: Path) -> None:
    run = cli(
        "--json",
        *BASE,
        "--iterations",
        "2",
        "--accumulation",
        "2",
        "--learning-rate",
        "1e-2",
        "--output",
        tmp_path / "a.safetensors",
    )
    assert run.code == 0, run.err
    events = run.events
    report = events[-1]["data"]["report"]
    assert report["first_loss"] == 0.0  # the policy is the reference: KL 0, and (ρ − 1)·A is 0
    assert all(key in report for key in REPORT), set(REPORT) - set(report)
    assert (report["prompts"], report["trained_prompts"], report["group"], report["steps"]) == (6, 6, 4, 6)
    assert report["reward"] == "length" and report["beta"] == 0.04 and report["temperature"] == 0.9
    assert [entry["iteration"] for entry in report["history"]] == [1, 2]
    for entry in report["history"]:
        assert list(entry) == HISTORY
        assert (entry["groups"], entry["completions"]) == (6, 24)
        assert entry["mean_reward"] == entry["mean_completion_tokens"]  # the length reward counts the tokens
    assert report["mean_reward"] == report["history"][-1]["mean_reward"]  # top level: the last iteration's
    assert report["history"][-1]["mean_kl"] > 0  # the adapter moved away from the reference
    steps = [
        e
        for e in events
        if e["type"] == "progress" and e["stage"] == "train" and e.get("data") and "reward" in e["data"]
    ]
    assert len(steps) == 6
    for event in steps:
        assert {
            "loss",
            "reward",
            "reward_spread",
            "kl",
            "policy_loss",
            "completion_tokens",
            "learning_rate",
            "tokens_per_second",
        } <= set(event["data"])
    assert steps[0]["data"]["loss"] == 0.0
    assert steps[0]["message"].startswith("iteration 1/2 step 1/3 loss 0.0000 reward ")
    messages = [e["message"] for e in events if e["type"] in ("progress", "log")]
    assert any(m.startswith("iteration 1/2 prompt ") and m.endswith(" sampling 4 completions") for m in messages)
    assert any(
        m.startswith("iteration 2/2 mean reward ") and " spread " in m and " policy loss " in m for m in messages
    )


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (
            ["--group", "1"],
            f"{SUBJECT} requires a group of at least two completions, because the group is the baseline",
        ),
        (
            ["--temperature", "0"],
            f"{SUBJECT} requires a temperature above zero; argmax sampling would draw one "
            "identical completion per group",
        ),
        (["--temperature", "-1"], f"{SUBJECT} requires a temperature above zero"),
        (["--beta", "-0.1"], f"{SUBJECT} requires a finite beta of zero or more"),
        (["--beta", "nan"], f"{SUBJECT} requires a finite beta of zero or more"),
        (["--beta", "inf"], f"{SUBJECT} requires a finite beta of zero or more"),
        (["--reward", ""], f"{SUBJECT} requires a reward source; pass length or a reward artifact"),
        (["--reward", "nope"], 'reward source "nope" is neither the keyword length nor a file that exists'),
        (["--max-new-tokens", "0"], "max_new_tokens must be greater than zero"),
        (["--iterations", "0"], f"{SUBJECT} requires at least one iteration"),
        (["--accumulation", "0"], f"{SUBJECT} requires an accumulation of at least one prompt"),
        (["--max-sequence", "12"], "every prompt is longer than the sequence limit, so there is nothing to train on"),
    ],
)
def test_refusals(cli, tmp_path: Path, flags: list[str], sentence: str) -> None:
    run = cli(*BASE, *flags, "--output", tmp_path / "a.safetensors")
    assert run.code == 1, run.err
    assert sentence in run.err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_generation_adapter_is_refused_as_the_reward_source(cli, tmp_path: Path) -> None:
    policy = tmp_path / "policy.safetensors"
    assert cli(*BASE, "--output", policy).code == 0
    run = cli(*BASE, "--reward", policy, "--output", tmp_path / "b.safetensors")
    assert run.code == 1
    assert "adapter artifact is a generation adapter, not a reward model" in run.err
    assert not (tmp_path / "b.safetensors").exists()


def test_grpo_takes_no_batch_size(cli, tmp_path: Path) -> None:
    assert cli(*BASE, "--batch-size", "2", "--output", tmp_path / "a.safetensors").code == 2  # not a flag of grpo
    with pytest.raises(ValueError, match="takes no batch size"):
        GrpoRequest(model="ster:toy", prompts=Path("p.json"), output=Path("a.safetensors"), batch_size=2)


def test_a_prompt_over_the_limit_is_skipped_with_a_line(cli, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    short, long = "question : tell me about the river . answer :", "question : tell me about the town " * 3
    prompts.write_text(json.dumps({"prompts": [short, long]}))
    run = cli(
        *BASE,
        "--prompts",
        prompts,
        "--max-new-tokens",
        "4",
        "--max-sequence",
        "16",
        "--output",
        tmp_path / "out" / "a.safetensors",
    )
    assert run.code == 0, run.err
    report = run.json["report"]
    assert (report["prompts"], report["trained_prompts"], report["skipped_long"]) == (2, 1, 1)
    assert "skipping prompt 2: 22 tokens and 4 new tokens exceed the 16 token limit" in run.err


def _toy():
    ctx = JobContext(lambda event: None)
    request = GrpoRequest(model="ster:toy", prompts=Path("p.json"), output=Path("a.safetensors"))
    checkpoint = model_store(ctx).open(request, ctx)
    return model_store(ctx).decoder(checkpoint, ctx), checkpoint


def test_an_empty_completion_refuses_the_group() -> None:
    decoder, checkpoint = _toy()
    everything = frozenset(range(checkpoint.config.vocab_size))  # the first draw ends the text
    objective = Grpo(
        group=2,
        beta=0.04,
        max_new_tokens=4,
        temperature=1.0,
        top_p=None,
        seed=1,
        eos_ids=everything,
        prompts=1,
        iterations=1,
    )
    unit = Unit(0, (checkpoint.codec.encode_prompt("the sea is"),), (0,))
    with pytest.raises(Refusal, match="a sampled completion was empty, so this group has nothing to score"):
        objective.losses(decoder, [unit])


def test_every_draw_of_the_run_has_its_own_seed(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []

    def recording(model, prompt, samplings, **kwargs):
        seeds.extend(s.seed for s in samplings)
        return decode_group(model, prompt, samplings, **kwargs)

    monkeypatch.setattr(grpo, "decode_group", recording)
    run = cli(*BASE, "--iterations", "2", "--seed", "100", "--output", tmp_path / "a.safetensors")
    assert run.code == 0, run.err
    assert sorted(seeds) == list(range(100, 100 + 2 * 6 * 4))  # seed + draw counter, across the whole run


def test_without_an_adapter_the_policy_is_the_reference() -> None:
    """With nothing attached the policy is the frozen base, so the KL and the loss are exactly 0."""
    decoder, checkpoint = _toy()
    objective = Grpo(
        group=3,
        beta=0.5,
        max_new_tokens=6,
        temperature=1.0,
        top_p=None,
        seed=9,
        eos_ids=checkpoint.codec.eos_ids,
        prompts=1,
        iterations=1,
    )
    unit = Unit(0, (checkpoint.codec.encode_prompt("the sea is"),), (0,))
    losses, stats = objective.losses(decoder, [unit])
    assert losses.item() == 0.0 and stats[0]["kl"] == 0.0
    assert stats[0]["reward"] == stats[0]["completion_tokens"]


def test_a_killed_run_resumes_to_the_same_adapter(cli, tmp_path: Path) -> None:
    flags = [*BASE, "--iterations", "2", "--accumulation", "2", "--learning-rate", "1e-2"]
    whole = cli(*flags, "--output", tmp_path / "whole" / "a.safetensors")
    assert whole.code == 0, whole.err
    out = tmp_path / "cut" / "a.safetensors"
    command = [*flags, "--output", str(out), "--checkpoint-every", "2"]
    killed_after_checkpoint(command, step=4)
    assert files(out.parent) == ["a.safetensors.checkpoint"]
    resumed = cli(*command, "--resume")
    assert resumed.code == 0, resumed.err
    assert "resuming after step 4 of 6" in resumed.err
    assert resumed.json["report"] == whole.json["report"]
    assert out.read_bytes() == (tmp_path / "whole" / "a.safetensors").read_bytes()


def test_a_reward_model_is_the_reward(cli, tmp_path: Path) -> None:
    """A reward model from ``tune reward`` scores each completion; the report names it, and the scores it gives
    are the reward model's own scores of prompt plus completion."""
    judge = tmp_path / "judge.safetensors"
    trained = cli(
        "tune",
        "reward",
        "--model",
        "ster:toy",
        "--pairs",
        "ster:pairs",
        "--learning-rate",
        "1e-2",
        "--epochs",
        "2",
        "--output",
        judge,
    )
    assert trained.code == 0, trained.err
    run = cli("--json", *BASE, "--reward", judge, "--output", tmp_path / "a.safetensors")
    assert run.code == 0, run.err
    report = run.events[-1]["data"]["report"]
    assert report["reward"] == f"reward:{judge}"
    assert report["first_loss"] == 0.0
    assert report["mean_reward"] != report["history"][-1]["mean_completion_tokens"]
    assert all(math.isfinite(entry["mean_reward"]) for entry in report["history"])


def test_the_reward_model_leaves_the_policy_attached() -> None:
    """Scoring swaps the reward model's factors in and puts the policy's back."""
    from ster.engine.model.adapters.lora import Adapter, attached

    decoder, checkpoint = _toy()
    config = checkpoint.config
    policy = Adapter.fresh(config, 4, 8.0, ["query", "value"], [0, 1], 1, torch.device("cpu"))
    judge = Adapter.fresh(config, 2, 4.0, ["up"], [2], 2, torch.device("cpu"), reward=True)
    with attached(decoder, policy):
        before = {name: dict(block.self_attn.lora) for name, block in enumerate(decoder.blocks)}
        scores = grpo.RewardModel(judge).scores(decoder, [[1, 2, 3], [1, 2, 4]])
        after = {name: dict(block.self_attn.lora) for name, block in enumerate(decoder.blocks)}
        assert before == after and before[0]
        assert all(not block.mlp.lora for block in decoder.blocks)
    assert len(scores) == 2
    assert all(not block.self_attn.lora for block in decoder.blocks)


def test_sampling_reads_the_policy_folded_into_the_weights_and_puts_everything_back() -> None:
    """folded: every adapted projection (fused q/k/v and gate/up, or alone, as o and down are) computes what
    the attached factors compute, with no factors attached; afterwards weights and factors are as they were."""
    from ster.engine.model.adapters.lora import Adapter, attached, folded

    decoder, checkpoint = _toy()
    policy = Adapter.fresh(
        checkpoint.config, 4, 8.0, ["query", "value", "output", "up", "down"], [0, 2], 1, torch.device("cpu")
    )
    with torch.no_grad():
        for tensor in policy.tensors.values():
            tensor.normal_(0, 0.05, generator=torch.Generator().manual_seed(tensor.numel()))
    ids = torch.tensor([checkpoint.codec.encode_prompt("the sea is")])
    modules = [module for block in decoder.blocks for module in (block.self_attn, block.mlp)]
    weights = [[id(child.weight) for child in module.children()] for module in modules]
    fused = [module.fused_weight for module in modules]
    with torch.no_grad(), attached(decoder, policy):
        adapted = decoder(ids, vocab="all").logits
        factors = [dict(module.lora) for module in modules]
        with folded(decoder):
            assert all(not module.lora for module in modules)
            assert torch.allclose(decoder(ids, vocab="all").logits, adapted, atol=1e-4)
        assert [dict(module.lora) for module in modules] == factors
        assert torch.equal(decoder(ids, vocab="all").logits, adapted)
    assert all(a is b for a, b in zip(fused, (module.fused_weight for module in modules)))
    assert weights == [[id(child.weight) for child in module.children()] for module in modules]
    assert not torch.allclose(decoder(ids, vocab="all").logits, adapted, atol=1e-4), "the policy changes the logits"
