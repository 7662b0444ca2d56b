"""The Generate pane's mode: what the artifact's direction does to the residual stream, and so what the
strength is.

``add`` steers, and the strength is the push (``0.4x``, or an absolute ``3``); ``ablate`` removes the
component along the direction, and the strength is the weight of what is removed, a plain number of at least
0 (1: all of it); ``clamp`` sets that component, and the strength is its target (``0.4x``, or absolute). The
mode is the request's ``mode`` on ``g``'s steered run and on ``w``'s sweep. The strength and sweep fields
start at the mode's defaults, which are the engine's (generate's rule for a strength left out, the sweep's
walks), and follow the mode while they hold what the pane put there; a typed value stays, and is checked
again by the request in the new mode, in the request's sentence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from textual.widgets import Label, Select

from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP
from ster.tui.settings import Settings
from ster.tui.widgets.fields import Field
from ster.tui.widgets.generate_jobs import GeneratePart
from ster.tui.widgets.sweep_table import SweepTable
from ster.tui.words import format_number, parse_strength, request_check

if TYPE_CHECKING:
    from ster.engine.steering.intervention import Mode

CHECKED_BESIDE = {"model": "ster:toy", "prompt": "a prompt"}
"""A generate request that passes: what the sampling fields are checked beside (each by the request's checks)."""
SWEEP_BESIDE = {"model": "ster:toy", "vector": "calm.ster.json", "prompt_texts": ["a prompt"]}
"""A sweep request that passes: what the sweep field is checked beside."""
STEPS = {"relative": (0.1, 0.01), "absolute": (1.0, 0.1), "weight": (0.1, 0.01)}
"""Per unit, the coarse (] and [) and fine (} and {) step of the strength keys; an ablation's weight steps by
tenths, since 1 is all of the component."""
STRENGTH_TIPS = {
    "add": "0.4x: 0.4 × each layer's activation spread (its norm, for an artifact older than the spread); 3: "
    f"absolute; empty: the artifact's calibrated strength, else {DEFAULT_STRENGTH}",
    "ablate": "the weight: the share of the component along the direction removed at each site, 0 or more "
    "(1: all of it); empty: 1",
    "clamp": "the target the component along the direction is set to at each site: 0.4x: 0.4 × the spread of the "
    f"layer whose direction is used; 3: absolute; empty: {DEFAULT_STRENGTH}",
}
SWEEP_HINTS = {
    "add": "x: × activation spread; 0 is always added",
    "ablate": "weights: the share removed; 0 is always added",
    "clamp": "targets, x: × activation spread; 0 is unedited",
}
MODE_TIP = (
    "add steers along the direction; ablate removes its component (the strength is the weight, 1: all of it); "
    "clamp sets the component to the strength; ablate and clamp edit the embedding and every block"
)


def untyped_strength(mode: str, settings: Settings, named: bool = False) -> str:
    """What an empty strength field stands for in ``mode``, by generate's own rule for a strength left out
    (``given_strength`` in :mod:`ster.engine.steering.generate`): an ablation's whole component (1); in add mode
    an imported vector as it was (1x), else the artifact's calibrated strength (``named``: as ``calibrated
    +0.25x``); else ``DEFAULT_STRENGTH``."""
    from ster.engine.steering.generate import left_out_strength

    artifact = settings.artifact or {}
    side = (artifact.get("calibration") or {}).get("positive")
    calibrated = side["strength"] if side else None
    strength = left_out_strength(cast("Mode", mode), artifact.get("strength_unit"), calibrated)
    if calibrated is not None and strength.value == calibrated:  # the rule took the calibrated strength
        return f"calibrated {settings.calibrated()}" if named else str(settings.calibrated())
    return str(strength)


def mode_strength(mode: str, settings: Settings) -> str:
    """What the pane puts in the strength field in ``mode``: an adopted strength (a steering one, so add's);
    empty for a calibrated artifact, so that ``g`` sends none and the engine steers at it; else what empty
    stands for."""
    if mode == "add" and settings.strength:
        return settings.strength
    if mode == "add" and settings.calibrated():
        return ""
    return untyped_strength(mode, settings)


def mode_fields(mode: str, settings: Settings) -> dict[str, Any]:
    """The request's mode, and in ablate mode an ablation-calibrated artifact's direction layer and weight
    profile, so the strength (a weight) scales the ablation as calibrated."""
    record = settings.ablation()
    if mode != "ablate" or record is None:
        return {"mode": mode}
    profile = {name: value for name, value in record["profile"].items() if value is not None}
    return {"mode": mode, "direction_layer": record["direction_layer"], **profile}


def mode_sweep(mode: str, settings: Settings) -> str:
    """What ``ster sweep`` walks in ``mode`` when given no strengths: an ablation's weights; in add mode half,
    once and twice a calibrated artifact's strengths; else ``DEFAULT_SWEEP``."""
    from ster.engine.steering.sweep import ABLATION_SWEEP

    if mode == "ablate":
        return ABLATION_SWEEP
    return (settings.calibrated_sweep() if mode == "add" else None) or DEFAULT_SWEEP


class GenerateMode(GeneratePart):
    """Mixed into the Generate pane: the mode selector, and the strength and sweep fields that follow it."""

    if TYPE_CHECKING:
        mode: str
        auto_strength: str
        auto_sweep: str
        shown_error: str | None

        def first_bad(self, *ids: str) -> bool: ...

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "mode" and event.value != self.mode:
            self.mode = str(event.value)
            self.follow_strength()

    def set_mode(self, mode: str) -> None:
        """Choose a mode from the pane (a row's, an adopted strength's), as choosing it in the form does."""
        if mode != self.mode:
            self.mode = mode
            self.query_one("#mode", Select).value = mode  # its Changed message then finds the mode chosen
            self.follow_strength()

    def follow_strength(self, adopted: bool = False) -> None:
        """The strength and sweep fields for the mode and the app's artifact: a value the pane put there moves to
        the new default (a calibrated artifact's strength field is left empty, so that ``g`` sends none and the
        engine steers at the calibrated strength, which the placeholder names); an adopted point's strength
        (``adopted``, a steering strength) is put in the field in add mode. A value the person typed stays,
        checked again."""
        settings = self.app.settings
        if adopted:
            self.set_mode("add")
        field, sweep = self.query_one("#strength", Field), self.query_one("#strengths", Field)
        field.placeholder = untyped_strength(self.mode, settings, named=True)
        field.tooltip = STRENGTH_TIPS[self.mode]
        self.query_one("#sweep-hint", Label).update(SWEEP_HINTS[self.mode])
        self.query_one(SweepTable).expect(self.mode)
        if adopted or field.value.strip() in (self.auto_strength, ""):  # not typed by the person
            field.value = self.auto_strength = mode_strength(self.mode, settings)
        if sweep.value.strip() in (self.auto_sweep, ""):
            sweep.value = self.auto_sweep = mode_sweep(self.mode, settings)
        for checked in (field, sweep):
            checked.validate(checked.value)  # a typed value, checked again by the request in this mode
        if self.shown_error in ("strength", "strengths"):
            self.say("", "")

    def check_strength(self, text: str) -> None:
        """The strength field, by generate's request in the mode chosen: empty is no strength (see
        :func:`untyped_strength`)."""
        if text.strip():
            request_check("generate", "strength", {**CHECKED_BESIDE, "mode": self.mode})(text)

    def check_sweep(self, text: str) -> None:
        """The sweep field, by the sweep's request in the mode chosen."""
        request_check("sweep", "strengths", {**SWEEP_BESIDE, "mode": self.mode})(text)

    def action_step(self, direction: int, fine: bool) -> None:
        """Nudge the strength in the form by a step of its own unit (the next ``g`` uses it); an ablation's
        weight by tenths, never below 0."""
        field = self.query_one("#strength", Field)
        if self.first_bad("strength"):  # a typed value the mode refuses: the request's sentence says why
            return
        strength: Any = parse_strength(field.value.strip() or untyped_strength(self.mode, self.app.settings))
        weight = self.mode == "ablate" and not strength.relative
        value = strength.value + direction * STEPS["weight" if weight else strength.unit][fine]
        value = format_number(max(value, 0.0) if weight else value)
        field.value = f"{value}x" if strength.relative else value
