"""Batched equals unbatched: rows of different lengths in one right-padded forward score as they do alone.

Checked where it matters, on each objective's per-unit losses and on the gradient they
send to the adapter, with an adapter that is not the identity (every B drawn, and a
reward head drawn) so that a padded key leaking into a real query, or an update applied
to the wrong row, would show. The reference is the same objective called one unit at a
time, which takes the plain causal path with no mask at all.
"""

from __future__ import annotations

import pytest
import torch

from ster.engine.model.adapters.lora import Adapter, attached
from ster.engine.model.config import load_config
from ster.engine.model.loading import load_decoder
from ster.engine.model.resolve import resolve_model
from ster.engine.protocol.jobs import JobContext
from ster.engine.tune.objectives import Preference, Reward, Sft, Unit

TARGETS = ["query", "key", "value", "output", "gate", "up", "down"]


@pytest.fixture(scope="module")
def model():
    source = resolve_model("ster:toy", None)
    config = load_config(source.config)
    decoder = load_decoder(source, config, "f32", torch.device("cpu"))
    adapter = Adapter.fresh(config, 4, 8, TARGETS, [0, 1, 2, 3], 5, torch.device("cpu"), reward=True)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, tensor in adapter.tensors.items():
            if not name.endswith(".a"):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)
    adapter.trainable()
    with attached(decoder, adapter):
        yield decoder, adapter


def _rows(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [[1, *torch.randint(4, 104, (n - 1,), generator=generator).tolist()] for n in lengths]


def _examples() -> list[Unit]:
    rows = _rows([9, 4, 12, 6], seed=1)
    return [Unit(i, (row,), (start,)) for i, (row, start) in enumerate(zip(rows, [5, 2, 3, 4]))]


def _pairs() -> list[Unit]:
    rows = _rows([7, 11, 5, 5, 13, 3], seed=2)
    return [Unit(i, (rows[2 * i], rows[2 * i + 1]), (1, 1)) for i in range(3)]


def _gradients(adapter: Adapter, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    params = list(adapter.tensors.values())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(adapter.tensors.items(), grads)}


def _objective(name: str, decoder, adapter: Adapter, units: list[Unit]):
    if name == "sft":
        return Sft()
    if name == "reward":
        return Reward(adapter.head)
    objective = Preference(beta=0.1, loss=name)
    objective.prepare(decoder, [[[unit] for unit in units]], JobContext(lambda event: None))
    return objective


@pytest.mark.parametrize("name", ["sft", "dpo", "ipo", "reward"])
def test_a_batched_forward_gives_each_unit_its_own_loss_and_gradient(model, name: str) -> None:
    decoder, adapter = model
    units = _examples() if name == "sft" else _pairs()
    assert len({len(row) for unit in units for row in unit.rows}) > 1  # rows differ, so padding happens
    objective = _objective(name, decoder, adapter, units)
    alone = torch.stack([objective.losses(decoder, [unit])[0][0] for unit in units])
    batched, stats = objective.losses(decoder, units)
    assert batched.shape == (len(units),) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)
    assert [s["loss"] for s in stats] == pytest.approx(alone.tolist(), rel=1e-5, abs=1e-5)
    expected = _gradients(adapter, alone.sum())
    for tensor_name, grad in _gradients(adapter, batched.sum()).items():
        scale = max(1.0, float(expected[tensor_name].abs().max()))  # f32 sums over every position differ by ~1e-5
        assert float((grad - expected[tensor_name]).abs().max()) <= 1e-4 * scale, tensor_name


def test_the_adapter_is_not_the_identity_here(model) -> None:
    """The premise of the test above: with B drawn, the adapted model differs from the base."""
    decoder, _adapter = model
    ids = torch.tensor([_rows([8], seed=3)[0]])
    with torch.no_grad():
        adapted = decoder(ids, vocab="all").logits
        base = decoder(ids, vocab="all", adapters=False).logits
    assert (adapted - base).abs().max() > 1e-2
