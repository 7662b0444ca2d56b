"""Data parallel training under ``torchrun``: each rank runs its share of every step's forwards.

Started by ``torchrun --nproc-per-node N -m ster tune …``, every process reads the
same data, draws the same adapter and walks the same order; rank ``r`` runs forwards
``r, r + N, …`` of each step. Because every unit's loss is already divided by the
step's constant ``batch × accumulation``, summing the gradients across ranks gives the
gradient one process would have, and every rank then takes the same AdamW step: the
same command gives the same adapter on one process or on N (up to the order of float
sums). The frozen reference of dpo is shared the same way: each rank scores its share
of the pairs and the scores are gathered.

Only rank 0 reports and writes. Decisions that must not differ between ranks are
collective: whether to stop (a Ctrl-C reaches each rank on its own, so each step
begins by asking whether any rank was cancelled) and whether a checkpoint may be
resumed (rank 0 reads it and hands it, or its refusal, to every rank). gloo carries
the sums on CPU, nccl on CUDA, where rank ``r`` uses the ``LOCAL_RANK``-th device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from ster.engine.protocol.errors import Refusal

T = TypeVar("T")


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world: int = 1
    joined: bool = False
    """Whether this process joined the group itself, and so leaves it in :meth:`close`."""

    @property
    def writer(self) -> bool:
        """Whether this process reports and writes: rank 0."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: torch.device) -> Parallel:
        """The process group ``torchrun`` describes in the environment, joined; one process otherwise.

        Call it before the weights load: on CUDA it chooses this rank's device first.
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), joined=True)

    def close(self) -> None:
        if self.joined:
            import torch.distributed as dist

            dist.destroy_process_group()

    def share(self, items: list[T]) -> list[tuple[int, T]]:
        """This rank's items (a step's forwards, the reference's chunks), each with its number."""
        return [(i, item) for i, item in enumerate(items) if i % self.world == self.rank]

    def everyone(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order (plain Python objects, pickled)."""
        if self.world <= 1:
            return [value]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def gather(self, numbered: list[tuple[int, list[Any]]]) -> list[Any]:
        """Every rank's per-unit numbers of a step, in the step's forward order."""
        everything = [item for part in self.everyone(numbered) for item in part]
        return [stat for _, stats in sorted(everything, key=lambda item: item[0]) for stat in stats]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank: one small all-reduce, so every rank decides alike."""
        if self.world <= 1:
            return flag
        import torch.distributed as dist

        box = torch.tensor([int(flag)], device=self._device())
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return bool(box.item())

    def reduce_gradients(self, params: list[Tensor]) -> None:
        """Sum each parameter's gradient over the ranks (a rank with no forward contributes zeros)."""
        if self.world <= 1:
            return
        import torch.distributed as dist

        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)

    def decided(self, decide: Callable[[], T]) -> T:
        """Rank 0's ``decide()`` on every rank; a refusal there is raised on every rank, so none waits."""
        if self.world <= 1:
            return decide()
        import torch.distributed as dist

        box: list[Any] = [None]
        if self.writer:
            try:
                box = [("value", decide())]
            except Refusal as exc:
                box = [("refused", str(exc))]
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "refused":
            raise Refusal(value)
        return value

    def _device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
