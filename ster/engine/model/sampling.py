"""How a next token is chosen and why decoding stopped: plain data, no torch.

Kept apart from :mod:`ster.engine.model.decoding` so the jobs' requests and result
documents can name them while the jobs check their inputs, before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

StopReason = Literal["eos", "max_new_tokens"]


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: argmax at temperature 0, else a seeded draw."""

    temperature: float = 0.0
    top_p: float | None = None
    seed: int = 42

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.temperature == 0:
            return None
        import torch

        return torch.Generator(device=device).manual_seed(self.seed)


@dataclass(frozen=True)
class Generation:
    ids: list[int]
    """Generated ids, without the EOS that stopped them."""
    stop_reason: StopReason
    end: int | None = None
    """The EOS id that stopped the text (None when it ran to its token budget)."""
