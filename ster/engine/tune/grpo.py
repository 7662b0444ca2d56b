"""Group-relative policy optimization: the objective that learns from text the policy writes itself.

For each prompt (a unit), :class:`Grpo` samples ``group`` completions from the policy as one
batch (:func:`~ster.engine.model.group_decoding.decode_group`: the prompt is prefilled once),
scores each with the reward source, and standardises the rewards within the group (population
std, no epsilon; a group whose rewards are all equal has advantages exactly 0). The loss of a
completion is the token mean of ``−(ρ·A − β·k3)`` over its tokens (its EOS included when it
ended on one, so the policy can learn when to stop), with ``ρ = exp(logp − logp.detach())``,
``k3 = exp(d) − d − 1`` and ``d = log π_ref − log π_θ``, the reference being the same decoder
with adapters off; a prompt's loss is the mean over its group.

ρ is 1 in value (its gradient is that of log π), so the published loss ``−A + β·KL`` averages,
over a group whose advantages sum to zero, to ``β·KL``. The policy term is computed as
``(ρ − 1)·A``, which has the same gradient and is exactly 0 in value, so float residue of the
advantages' sum never shows and the first loss, where the policy is the reference, is exactly 0.

Draw ``i`` of prompt ``p`` in iteration ``e`` is seeded ``seed + (e·prompts + p)·group + i``: the
seed advances per draw across the run, and a run (resumed, or spread over ranks) reproduces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ster.engine.model.adapters.lora import Adapter, attached, folded
from ster.engine.model.contract import Decoder
from ster.engine.model.group_decoding import decode_group
from ster.engine.model.sampling import Sampling
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.objectives import ONE_PROCESS, Objective, Report, Stats, Unit, mean
from ster.engine.tune.parallel import Parallel
from ster.engine.tune.rows import forward_tree, tree_last_states, tree_logprobs


@dataclass(frozen=True)
class RewardModel:
    """A reward artifact from ``tune reward``, frozen: its adapter and head score prompt plus completion."""

    adapter: Adapter

    def scores(self, decoder: Decoder, rows: list[list[int]]) -> list[float]:
        with torch.no_grad(), attached(decoder, self.adapter):
            hidden, tree = forward_tree(decoder, rows)
            states = tree_last_states(decoder, hidden, tree)
        head = self.adapter.head
        assert head is not None
        return (states.float() @ head.T)[:, 0].tolist()


def advantages(rewards: list[float]) -> list[float]:
    """``(r − mean) / std`` with the population std and no epsilon; all 0 when the rewards are equal."""
    centre = mean(rewards)
    std = math.sqrt(math.fsum((r - centre) ** 2 for r in rewards) / len(rewards))
    return [0.0] * len(rewards) if std == 0 else [(r - centre) / std for r in rewards]


@dataclass
class Grpo(Objective):
    group: int
    beta: float
    max_new_tokens: int
    temperature: float
    top_p: float | None
    seed: int
    eos_ids: frozenset[int]
    prompts: int
    """Prompts in the data, skipped ones included: the stride of the draw counter per iteration."""
    iterations: int
    reward_model: RewardModel | None = None
    """None: the reward is the completion's length in tokens."""
    ctx: JobContext | None = field(default=None, repr=False)
    epoch: int = 0
    name: str = "grpo"
    unit: str = "prompt"
    fusable: bool = False
    """Each prompt's group is its own forward: the prompts of a step spread over the ranks."""

    def prepare(
        self, decoder: Decoder, shares: list[list[list[Unit]]], ctx: JobContext, parallel: Parallel = ONE_PROCESS
    ) -> None:
        self.ctx = ctx

    def begin(self, epoch: int) -> None:
        self.epoch = epoch

    def losses(self, decoder: Decoder, units: list[Unit]) -> tuple[Tensor, list[Stats]]:
        losses, stats = [], []
        for unit in units:
            loss, numbers = self._prompt(decoder, unit)
            losses.append(loss)
            stats.append(numbers)
        return torch.stack(losses), stats

    def _prompt(self, decoder: Decoder, unit: Unit) -> tuple[Tensor, Stats]:
        prompt = unit.rows[0]
        if self.ctx is not None:
            self.ctx.progress(
                "sample",
                f"iteration {self.epoch + 1}/{self.iterations} prompt {unit.index + 1} "
                f"sampling {self.group} completions",
            )
        first = self.seed + (self.epoch * self.prompts + unit.index) * self.group
        samplings = [Sampling(self.temperature, self.top_p, first + i) for i in range(self.group)]
        with folded(decoder):  # the policy's updates folded into its weights: a step costs what the base's does
            drawn = decode_group(
                decoder,
                prompt,
                samplings,
                max_new_tokens=self.max_new_tokens,
                eos_ids=self.eos_ids,
                check_cancelled=lambda: None,
            )  # cancel: between steps
        if any(not generation.ids for generation in drawn):
            raise Refusal("a sampled completion was empty, so this group has nothing to score")
        completions = [g.ids + ([g.end] if g.end is not None else []) for g in drawn]
        rows = [prompt + completion for completion in completions]
        rewards = (
            [float(len(g.ids)) for g in drawn] if self.reward_model is None else self.reward_model.scores(decoder, rows)
        )
        advantage = torch.tensor(advantages(rewards), dtype=torch.float32, device=decoder.lm_head.weight.device)
        starts = [len(prompt)] * len(rows)
        hidden, tree = forward_tree(decoder, rows)
        policy = tree_logprobs(decoder, hidden, tree, rows, starts)
        with torch.no_grad():
            hidden, tree = forward_tree(decoder, rows, adapters=False)
            reference = tree_logprobs(decoder, hidden, tree, rows, starts)
        per_completion, kls = [], []
        for i, (logp, ref) in enumerate(zip(policy, reference)):
            d = ref - logp
            k3 = torch.exp(d) - d - 1
            ratio = torch.exp(logp - logp.detach())
            per_completion.append(-((ratio - 1) * advantage[i] - self.beta * k3).mean())
            kls.append(float(k3.detach().mean()))
        loss = torch.stack(per_completion).mean()
        mean_reward = mean(rewards)
        spread = math.sqrt(math.fsum((r - mean_reward) ** 2 for r in rewards) / len(rewards))
        generated = sum(len(g.ids) for g in drawn)
        return loss, {
            "loss": float(loss.detach()),
            "reward": mean_reward,
            "reward_spread": spread,
            "kl": mean(kls),
            "completion_tokens": generated / len(drawn),
            "tokens": float(generated + sum(len(row) for row in rows)),
        }

    def step_tokens(self, units: list[Unit], stats: list[Stats]) -> int:
        return int(sum(s["tokens"] for s in stats))

    step_line = "iteration {epoch}/{epochs} step {within}/{steps} loss {loss:.4f} reward {reward:.4f} kl {kl:.4f}"
    epoch_line = (
        "iteration {epoch}/{epochs} mean reward {mean_reward:.4f} spread {reward_spread:.4f} "
        "mean kl {mean_kl:.4f} policy loss {policy_loss:.4f}"
    )
    period = "iteration"

    def report(self, stats: list[Stats]) -> Report:
        """The mean reward, its spread, the KL, the policy loss and the completions' length, on every line."""
        reward, kl = mean(s["reward"] for s in stats), mean(s["kl"] for s in stats)
        spread, policy = mean(s["reward_spread"] for s in stats), mean(s["loss"] for s in stats)
        length = mean(s["completion_tokens"] for s in stats)
        summary = {
            "mean_reward": reward,
            "reward_spread": spread,
            "mean_kl": kl,
            "policy_loss": policy,
            "mean_completion_tokens": length,
        }
        return Report(
            shown={
                "reward": reward,
                "kl": kl,
                "reward_spread": spread,
                "policy_loss": policy,
                "completion_tokens": length,
            },
            summary=summary,
            epoch={"groups": len(stats), "completions": len(stats) * self.group, **summary},
        )
