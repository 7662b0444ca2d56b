"""What the app is working on: the model and how it is loaded, the pair set, the artifact, the adapter."""

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
    trait: str | None = None
    """The trait name of that pair set, once the Pairs pane has read it (names the default artifact)."""
    vector: Path | None = None
    """The steering artifact the Generate pane applies."""
    artifact: dict[str, Any] | None = None
    """What the engine reported about ``vector`` (its trait, method, model and layers); None until it has."""
    strength: str | None = None
    """The strength the Generate pane steers at, once a calibration point was adopted (``0.3x``); None leaves the
    pane's field as it is. A new artifact clears it."""
    adapter: Path | None = None
    """The LoRA adapter the Generate pane compares with the base model; None until one is made or chosen."""
    adapter_info: dict[str, Any] | None = None
    """What is known of ``adapter`` (its objective, model, report summary), or None."""

    def model_fields(self) -> dict[str, Any]:
        """The model flags of a job request."""
        return {
            "model": self.model,
            "precision": self.precision,
            "device": self.device,
            "chat_template": self.chat_template,
        }

    def use_artifact(self, path: Path, summary: dict[str, Any] | None) -> None:
        """The artifact the Generate pane applies from now on, with the engine's summary of it."""
        self.vector, self.artifact, self.strength = path, summary, None

    def use_adapter(self, path: Path | None, info: dict[str, Any] | None = None) -> None:
        """The adapter the Generate pane offers from now on (None: no adapter)."""
        self.adapter, self.adapter_info = path, info

    def adapter_label(self) -> str:
        """The adapter as panes name it: its file name without ``.safetensors``, or ``none``."""
        return "none" if self.adapter is None else self.adapter.name.removesuffix(".safetensors")

    def ablation(self) -> dict[str, Any] | None:
        """The artifact's calibrated ablation (``calibrate --mode ablate``'s record), or None."""
        record = ((self.artifact or {}).get("calibration") or {}).get("ablation")
        return record if isinstance(record, dict) else None

    def calibrated(self) -> str | None:
        """The artifact's calibrated positive strength as the Generate pane names it (``+0.25x``), or None for an
        artifact without one (generate then steers at it when no strength is given)."""
        side = ((self.artifact or {}).get("calibration") or {}).get("positive")
        return None if not side else f"{side['strength']:+.3g}x"

    def calibrated_sweep(self) -> str | None:
        """The strengths the engine sweeps a calibrated artifact at when none are given (half, once and twice each
        sign's calibrated strength), as the sweep field writes them; None for an artifact without one."""
        record = (self.artifact or {}).get("calibration") or {}
        sides = [record[sign]["strength"] for sign in ("negative", "positive") if record.get(sign)]
        if not sides:
            return None
        from ster.engine.steering.sweep import CALIBRATED_STEPS

        values = sorted({round(step * round(side, 4), 4) for side in sides for step in CALIBRATED_STEPS})
        return ",".join(f"{value:g}x" for value in values)

    def artifact_label(self) -> str:
        """The artifact as the status line and the steered panel name it: ``calm.caa.toy (caa, layer 3)``."""
        if self.vector is None:
            return "none"
        name = self.vector.name.removesuffix(".json").removesuffix(".ster")
        if not self.artifact:
            return name
        layers = [entry["layer"] for entry in self.artifact["layers"]]
        return f"{name} ({self.artifact['method']}, {layer_words(layers)})"


def layer_words(layers: list[int]) -> str:
    """``layer 3``, ``layers 2, 5``, or ``layers 2–6`` for a run of consecutive layers."""
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}–{layers[-1]}"
    return "layers " + ", ".join(map(str, layers))
