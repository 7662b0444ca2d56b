"""The toy as transformers' own model, and a direction fitted on it, for the tests of ``ster.steer`` and the peers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ster.engine.model.resolve import TOY_DIR


@pytest.fixture
def hf_toy() -> Any:
    """The bundled toy checkpoint loaded by transformers (LlamaForCausalLM), fresh for each test."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(TOY_DIR), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A direction per layer of the toy, fitted by ``ster train`` on the bundled pairs."""
    from ster.cli import main

    out = tmp_path_factory.mktemp("fitted") / "calm.json"
    assert main(["train", "--model", "ster:toy", "--pairs", "ster:pairs", "--output", str(out)]) == 0
    return out


def hooks_on(model: Any) -> int:
    """How many forward hooks and pre-hooks the model's modules carry."""
    return sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())
