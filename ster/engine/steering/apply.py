"""Editing the residual stream while the model runs: adding a direction, ablating it, clamping it.

A batch of rows each carries its own :data:`~ster.engine.steering.intervention.Plan`. At each site any row
edits, the rows' edits are stacked: per row a unit direction ``v`` [R, D], an addition ``a·v`` already in the
model's dtype, and a weight ``w`` and target ``c`` [R] of the projection, so that one hook applies
``h ← h + w·(c − h·v)·v + a·v`` to every row at every position, the prompt's and each new token's. A row
that does nothing at a site has zeros there. The component ``h·v`` is read in f32 whatever the model's
dtype. The hooks are removed in ``finally`` whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.model.hooks import added, edited
from ster.engine.steering.intervention import Plan


def plan(model: Decoder, vectors: dict[int, list[float]], scales: dict[int, float]) -> dict[int, Tensor]:
    """Per layer, ``scales[layer] × vector`` in the model's dtype and on its device."""
    weight = model.lm_head.weight
    return {
        layer: (torch.tensor(vector, dtype=torch.float32) * scales[layer]).to(weight.device, weight.dtype)
        for layer, vector in vectors.items()
    }


@contextmanager
def steer(model: Decoder, additions: dict[int, Tensor]) -> Iterator[None]:
    """Add ``additions[layer]`` to the output of each listed block for the duration of the block."""
    with added(model, list(additions), additions.__getitem__):
        yield


@dataclass(frozen=True)
class SiteRows:
    """The rows' edits at one site."""

    addition: Tensor | None
    """[R, D] ``a·v`` in the model's dtype; None where no row adds here."""
    direction: Tensor | None
    """[R, D] f32 unit directions of the rows that project here (zeros for the others); None where none does."""
    weight: Tensor | None
    """[R] f32 weight of each row's projection."""
    target: Tensor | None
    """[R] f32 target of each row's projection."""

    def select(self, rows: Tensor) -> SiteRows:
        return SiteRows(*(None if t is None else t.index_select(0, rows) for t in self._tensors()))

    def _tensors(self) -> tuple[Tensor | None, ...]:
        return (self.addition, self.direction, self.weight, self.target)

    def apply(self, hidden: Tensor) -> Tensor:
        """``hidden`` [R, T, D] (or [1, T, D] for every row alike) edited row by row."""
        if self.direction is not None and self.weight is not None and self.target is not None:
            direction = self.direction[:, None, :]  # [R, 1, D]
            along = (hidden.float() * direction).sum(-1, keepdim=True)  # [R, T, 1]
            moved = self.weight[:, None, None] * (self.target[:, None, None] - along)
            hidden = hidden + (moved * direction).to(hidden.dtype)
        if self.addition is not None:
            hidden = hidden + self.addition[:, None, :]
        return hidden


class RowEdits:
    """Every row's plan as stacked tensors per site, and the hooks that apply them; :meth:`select` follows the
    batch as rows leave it (the group decoder's ``select_rows``)."""

    def __init__(self, sites: dict[int, SiteRows]) -> None:
        self.full = sites
        self.current = sites

    @staticmethod
    def of(model: Decoder, plans: list[Plan]) -> RowEdits | None:
        """The rows' plans stacked on the model's device; None when no row edits anything."""
        sites = sorted({site for row in plans for site in row})
        if not sites:
            return None
        weight = model.lm_head.weight
        width = model.config.hidden_size
        stacked: dict[int, SiteRows] = {}
        for site in sites:
            edits = [row.get(site) for row in plans]
            directions = torch.zeros(len(plans), width, dtype=torch.float32)
            amounts = torch.zeros(len(plans), 3, dtype=torch.float32)  # add, weight, target
            for r, edit in enumerate(edits):
                if edit is not None:
                    directions[r] = torch.tensor(edit.direction, dtype=torch.float32)
                    amounts[r] = torch.tensor([edit.add, edit.weight, edit.target], dtype=torch.float32)
            adds = any(edit is not None and edit.add != 0.0 for edit in edits)
            projects = any(edit is not None and edit.projects for edit in edits)
            # the addition as plan() makes it, so steering alone is the same arithmetic as ever
            addition = (amounts[:, :1] * directions).to(weight.device, weight.dtype) if adds else None
            on = directions.to(weight.device)
            stacked[site] = SiteRows(
                addition,
                on if projects else None,
                amounts[:, 1].to(weight.device) if projects else None,
                amounts[:, 2].to(weight.device) if projects else None,
            )
        return RowEdits(stacked)

    def select(self, rows: Tensor) -> None:
        self.current = {site: edits.select(rows) for site, edits in self.full.items()}

    def applied(self, model: Decoder) -> AbstractContextManager[None]:
        """Edit the stream at every site for the current rows, every position."""
        return edited(model, list(self.full), lambda site, hidden: self.current[site].apply(hidden))
