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
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from ster.engine.model.contract import Decoder
from ster.engine.model.hooks import added, edited
from ster.engine.steering.intervention import Edit, Plan


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


@dataclass(frozen=True)
class WriteRows:
    """The rows' ablations of one block's writes: per write (the attention's, the MLP's), [R, D] f32 unit
    directions (zeros for a row that leaves the block alone) and [R] weights."""

    directions: tuple[Tensor, Tensor]
    weight: Tensor

    def select(self, rows: Tensor) -> WriteRows:
        first, second = (d.index_select(0, rows) for d in self.directions)
        return WriteRows((first, second), self.weight.index_select(0, rows))

    def apply(self, which: int, write: Tensor) -> Tensor:
        """``write`` [R, T, D] less ``weight`` of its component along each row's direction."""
        direction = self.directions[which][:, None, :]
        along = (write.float() * direction).sum(-1, keepdim=True)
        return write - (self.weight[:, None, None] * along * direction).to(write.dtype)


class RowEdits:
    """Every row's plan as stacked tensors per site, and the hooks that apply them; :meth:`select` follows the
    batch as rows leave it (the group decoder's ``select_rows``)."""

    def __init__(self, sites: dict[int, SiteRows], writes: dict[int, WriteRows]) -> None:
        self.full, self.full_writes = sites, writes
        self.current, self.current_writes = sites, writes

    @staticmethod
    def of(model: Decoder, plans: list[Plan]) -> RowEdits | None:
        """The rows' plans stacked on the model's device; None when no row edits anything."""
        stream = sorted({site for row in plans for site, edit in row.items() if not edit.on_writes})
        written = sorted({site for row in plans for site, edit in row.items() if edit.on_writes})
        if not stream and not written:
            return None
        sites = {site: _stacked(model, [_stream_edit(row.get(site)) for row in plans]) for site in stream}
        writes = {site: _written(model, site, [row.get(site) for row in plans]) for site in written}
        return RowEdits(sites, writes)

    @property
    def first(self) -> int:
        """The earliest site any row edits (the embedding's, -1, before every block)."""
        return min([*self.full, *self.full_writes])

    def select(self, rows: Tensor) -> None:
        self.current = {site: edits.select(rows) for site, edits in self.full.items()}
        self.current_writes = {site: edits.select(rows) for site, edits in self.full_writes.items()}

    @contextmanager
    def applied(self, model: Decoder) -> Iterator[None]:
        """Edit the stream at every site and the writes of every edited block, for the current rows, every position."""
        with (
            edited(model, list(self.full), lambda site, hidden: self.current[site].apply(hidden)),
            model.edited_writes(
                list(self.full_writes), lambda site, which, write: self.current_writes[site].apply(which, write)
            ),
        ):
            yield


def _stream_edit(edit: Edit | None) -> Edit | None:
    """A row's edit of the stream at a site, or None where it edits none (or edits the block's writes instead)."""
    return None if edit is None or edit.on_writes else edit


def _stacked(model: Decoder, edits: list[Edit | None]) -> SiteRows:
    """The rows' stream edits at one site as tensors."""
    weight = model.lm_head.weight
    directions = torch.zeros(len(edits), model.config.hidden_size, dtype=torch.float32)
    amounts = torch.zeros(len(edits), 3, dtype=torch.float32)  # add, weight, target
    for r, edit in enumerate(edits):
        if edit is not None:
            directions[r] = torch.tensor(edit.direction, dtype=torch.float32)
            amounts[r] = torch.tensor([edit.add, edit.weight, edit.target], dtype=torch.float32)
    adds = any(edit is not None and edit.add != 0.0 for edit in edits)
    projects = any(edit is not None and edit.projects for edit in edits)
    # the addition as plan() makes it, so steering alone is the same arithmetic as ever
    addition = (amounts[:, :1] * directions).to(weight.device, weight.dtype) if adds else None
    on = directions.to(weight.device)
    return SiteRows(
        addition,
        on if projects else None,
        amounts[:, 1].to(weight.device) if projects else None,
        amounts[:, 2].to(weight.device) if projects else None,
    )


def _written(model: Decoder, layer: int, edits: list[Edit | None]) -> WriteRows:
    """The rows' ablations of block ``layer``'s writes: each direction as the write sees it, ``g ⊙ v`` normalised
    where the block normalises its writes by a scale ``g`` (so the normalised write loses all of ``v``)."""
    device = model.lm_head.weight.device
    gains = model.write_gains(layer)
    weights = torch.zeros(len(edits), dtype=torch.float32)
    rows = torch.zeros(len(edits), model.config.hidden_size, dtype=torch.float32)
    for r, edit in enumerate(edits):
        if edit is not None and edit.on_writes:
            rows[r] = torch.tensor(edit.direction, dtype=torch.float32)
            weights[r] = edit.weight
    directions = []
    for gain in gains:
        seen = rows if gain is None else rows * gain.to("cpu")[None, :]
        norms = seen.norm(dim=-1, keepdim=True)
        directions.append(torch.where(norms > 0, seen / norms.clamp(min=1e-30), seen).to(device))
    return WriteRows((directions[0], directions[1]), weights.to(device))
