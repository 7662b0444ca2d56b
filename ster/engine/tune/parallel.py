"""Data parallel training under ``torchrun``: each rank runs its share of every step's forwards.

Started by ``torchrun --nproc-per-node N -m ster tune …``, every process reads the
same data, draws the same adapter and walks the same order; rank ``r`` runs forwards
``r, r + N, …`` of each step. Because every unit's loss is already divided by the
step's constant ``batch × accumulation``, summing the gradients across ranks gives the
gradient one process would have, and every rank then takes the same AdamW step. Only
rank 0 reports and writes. gloo carries the sums on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world: int = 1

    @property
    def writer(self) -> bool:
        """Whether this process reports and writes: rank 0."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: torch.device) -> Parallel:
        """The process group ``torchrun`` describes in the environment, joined; one process otherwise."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def share(self, forwards: list[T]) -> list[tuple[int, T]]:
        """This rank's forwards of a step, each with its number in the step."""
        return [(i, forward) for i, forward in enumerate(forwards) if i % self.world == self.rank]

    def gather(self, numbered: list[tuple[int, list[Any]]]) -> list[Any]:
        """Every rank's per-unit numbers of a step, in the step's forward order."""
        if self.world > 1:
            import torch.distributed as dist

            everyone: list[Any] = [None] * self.world
            dist.all_gather_object(everyone, numbered)
            numbered = [item for part in everyone for item in part]
        return [stat for _, stats in sorted(numbered, key=lambda item: item[0]) for stat in stats]

    def reduce_gradients(self, params: list[Tensor]) -> None:
        """Sum each parameter's gradient over the ranks (a rank with no forward contributes zeros)."""
        if self.world <= 1:
            return
        import torch.distributed as dist

        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)

    def broadcast_object(self, value: T) -> T:
        """Rank 0's value on every rank (a decision only rank 0 may take, such as a refusal)."""
        if self.world <= 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
