"""What the two calibration searches share: the study file beside the output that a run interrupted by Ctrl-C
continues with ``--resume``, the neutral prompt set KL is measured on, and the split of the pairs into those
the directions are fitted on and those held out.

The steering search (:mod:`ster.engine.steering.calibrate`) and the ablation search
(:mod:`ster.engine.steering.ablation_search`) both read these, so neither imports the other's module.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ster.engine.pairs.model import load_pairs
from ster.engine.pairs.workspace import load_pairs_or_active
from ster.engine.protocol.errors import Cancelled, Refusal
from ster.engine.protocol.files import dumps_pretty, first_error, load_document, read_json, write_atomic
from ster.engine.protocol.kinds import CALIBRATION_STUDY
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import bundled_name, example_path
from ster.engine.steering.extract import PromptSet
from ster.engine.steering.requests import CalibrateRequest

MAX_NEUTRAL = 1000
NEUTRAL = "ster:neutral"

S = TypeVar("S", bound="StudyFile")


class StudyFile(BaseModel):
    """What a calibration study holds beside its trials: what it was started with."""

    product: str = "ster"
    identity: dict[str, Any]


def study_path(output: Path) -> Path:
    return output.with_name(output.name.removesuffix(".json") + ".study.json")


def load_neutral(given: Path | None) -> tuple[list[str], str]:
    """The neutral set's prompts (``ster:neutral`` when none is given) and their SHA-256; refuses an empty or
    over-long set in one sentence."""
    path = given or example_path(NEUTRAL)
    document = load_document(path, PromptSet, "neutral set")
    prompts = document.prompts
    if len(prompts) > MAX_NEUTRAL:
        raise Refusal(
            f"neutral set {bundled_name(path)} has {len(prompts)} prompts; KL is measured on at most "
            f"{MAX_NEUTRAL}, so give a smaller set"
        )
    digest = hashlib.sha256("\n\x00".join(prompts).encode()).hexdigest()
    return prompts, digest


def split(request: CalibrateRequest) -> tuple[Any, list[Any], list[Any]]:
    path, pair_set = load_pairs_or_active(request.pairs)
    if request.holdout is not None:
        held = load_pairs(request.holdout).pairs
        fit = pair_set.pairs
    else:
        total = len(pair_set.pairs)
        if total < 4:
            raise Refusal(
                f"calibrate needs at least 4 pairs to hold some out from fitting, or {flag('holdout')} FILE; "
                f"pair set {path} has {total}"
            )
        fit_count = (total * 8) // 10
        fit, held = pair_set.pairs[:fit_count], pair_set.pairs[fit_count:]
    if len(fit) < 2:
        raise Refusal(f"calibrate fits each direction on at least 2 pairs; pair set {path} leaves {len(fit)}")
    return pair_set, fit, held


def open_study(path: Path, resume: bool, identity: dict[str, Any], kind: type[S]) -> S | None:
    exists = path.exists() or path.is_symlink()
    if not resume:
        if exists:
            raise Refusal(
                f"a calibration study from an interrupted run is at {path}: give {flag('resume')} to continue it, "
                f"or remove it to start over"
            )
        return None
    if not exists:
        raise Refusal(
            f"{flag('resume')} found no calibration study at {path}, which is where a run with this {flag('output')} leaves one"
        )
    try:
        study = kind.model_validate(read_json(path, CALIBRATION_STUDY))
    except ValidationError as exc:
        raise Refusal(f"calibration study {path} is not in the expected shape: {first_error(exc)}") from None
    for key, value in identity.items():
        if study.identity.get(key) != value:
            raise Refusal(
                f"calibration study {path} was started with {key} {study.identity.get(key)!r}, not "
                f"{value!r}; resume it with the same inputs, or remove it to start over"
            )
    return study


def save_study(path: Path, study: BaseModel) -> None:
    """Write the study atomically; it does not count as the job's output, so Ctrl-C still cancels the run after it
    (a run that stops leaves it on purpose, as a training run leaves its checkpoint)."""
    type(study).model_validate(study.model_dump())
    write_atomic(path, dumps_pretty(study.model_dump(mode="json")), keep=True)


def stopped(trials: list[Any], study: Path) -> None:
    """Re-raise a cancellation, naming the study when trials are saved in it."""
    if trials:
        raise Cancelled(
            f"cancelled after trial {len(trials)}; the study at {study} continues it when the same "
            f"command is given with {flag('resume')}"
        ) from None
    raise Cancelled()
