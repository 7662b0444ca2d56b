"""What the app is working on: the model and how it is loaded, the pair set, the artifact."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Settings:
    """Set by the model dialog and the panes; read when a job request is built."""

    model: str = "ster:toy"
    precision: str = "f32"
    device: str = "cpu"
    chat_template: str = "auto"
    chat_decision: str | None = None
    """The decision the last job on this model reported (applied, absent or off)."""
    pairs: Path | None = None
    """The pair set the Pairs pane holds and the other panes train and evaluate on."""
    vector: Path | None = None
    """The steering artifact the Generate pane applies."""

    def model_fields(self) -> dict[str, Any]:
        """The model flags of a job request."""
        return {"model": self.model, "precision": self.precision, "device": self.device,
                "chat_template": self.chat_template}
