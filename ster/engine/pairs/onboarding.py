"""First use: a short walkthrough that ends once the user has a pair set.

``ster onboarding`` shows a few screens about Ster (what a pair set is, how to write,
import or synthesize one, and the bundled toy model to try first), one ``log`` event
per screen, and saves its progress under ``$XDG_STATE_HOME/ster`` (else
``~/.local/state/ster``) in ``onboarding.json``. The walkthrough is complete as soon as
a pair set is imported (``ster workspace import-pairs`` or ``ster onboarding
--import-pairs``) or written (``ster pairs add``, ``ster pairs synthesize``, through
:func:`~ster.engine.pairs.first_use.note_pair_set_written`); a replay after that says so instead of showing the
screens again, until ``--reset`` deletes the saved progress.

The screens are data (:data:`SCREENS`), so the TUI can page through the same text.
Progress is state, not data: losing it only means seeing the walkthrough again, so
recording it never fails a write that already happened. Nothing here imports torch,
transformers or textual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ster.engine.pairs.first_use import OnboardingState, now, read_state, reset, save, state_path
from ster.engine.pairs.requests import OnboardingRequest
from ster.engine.pairs.workspace import ImportOutcome, import_pair_set
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.protocol.naming import flag

ENDS_WHEN = (
    "the walkthrough ends when a pair set is imported (ster workspace import-pairs FILE, or ster "
    "onboarding --import-pairs FILE) or written (ster pairs add, ster pairs synthesize)"
)


class Screen(BaseModel):
    """One page of the walkthrough."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    title: str
    """A few words, shown as the page's heading."""
    body: str
    """A short paragraph; commands in it are meant to be copied as they stand."""


SCREENS: tuple[Screen, ...] = (
    Screen(
        title="Welcome to Ster",
        body=(
            "Ster reads the hidden states of a causal language model (Llama, Qwen, Mistral, Phi-3, Gemma, and the "
            "others transformers can load), fits a steering direction for a trait from contrastive pairs, and adds "
            "that direction back into the model while it generates. Everything starts from a pair set; this "
            "walkthrough ends as soon as you import or write one."
        ),
    ),
    Screen(
        title="What a pair set is",
        body=(
            'A pair set is a JSON file {"trait_name": "calm", "pairs": [{"positive": "...", "negative": "..."}]}. '
            "Each pair is a positive and a negative text that differ only in the trait: same question, same "
            "length, same style, one answer showing the trait and one not. The difference between their hidden "
            "states is what points along the trait, so anything else that differs becomes noise in the direction."
        ),
    ),
    Screen(
        title="Write one",
        body=(
            "ster pairs add appends one pair at a time and creates the file, and its directory, when it does not "
            "exist yet:\n"
            '  ster pairs add --pairs pairs.json --trait calm --positive "question : how is the sea ? answer : the '
            'sea is quiet ." --negative "question : how is the sea ? answer : the sea is wild ."\n'
            "ster pairs inspect --pairs pairs.json then reports duplicates, refusals and balance."
        ),
    ),
    Screen(
        title="Import one",
        body=(
            "If you already have a pair set, import it (the bundled example is ster:pairs):\n"
            "  ster workspace import-pairs ./my-pairs.json   (or: ster onboarding --import-pairs ./my-pairs.json)\n"
            "Ster validates the whole file, keeps a canonical copy under $XDG_DATA_HOME/ster and makes it the "
            "active set, so train, optimize, evaluate and pairs inspect use it when --pairs is omitted. "
            "ster workspace show lists the sets; ster workspace select ID switches between them."
        ),
    ),
    Screen(
        title="Try the toy model",
        body=(
            "A tiny checkpoint ships with Ster, so the whole loop runs in seconds with no download. Select a "
            "direction on its calm/alarmed pairs (bundled as ster:pairs, a name that works from any directory), "
            "then generate with it:\n"
            "  ster optimize --model ster:toy --pairs ster:pairs --output runs/calm.ster.json\n"
            '  ster generate --model ster:toy --vector runs/calm.ster.json --strength 0.4x --prompt "question : tell '
            'me about the town . answer :"\n'
            "Drop --vector to see the unsteered answer; ster sweep --prompts ster:prompts shows which strength "
            "moves the text without breaking it."
        ),
    ),
    Screen(
        title="Synthesize a set",
        body=(
            "No pairs yet? ster pairs synthesize writes a whole set from a one-sentence trait description, "
            "generating both sides of every pair with a model:\n"
            '  ster pairs synthesize --model meta-llama/Llama-3.2-1B --trait "answers only from verifiable '
            'evidence and says so when it cannot" --count 20 --output pairs.json\n'
            "Read the pairs before you trust them: a generated set is a draft."
        ),
    ),
)
"""The walkthrough, in order."""


class OnboardingResult(BaseModel):
    """What ``ster onboarding`` prints."""

    status: Literal["in_progress", "complete"]
    """``complete`` once a pair set has been imported or written; ``in_progress`` until then."""
    screens: list[Screen]
    """The screens shown by this run: all of them while in progress, none on a replay after completion."""
    ends_when: str
    """What completes the walkthrough."""
    completed_at: str | None
    how: str | None
    """What completed it: ``imported <id>`` or ``wrote <path>``; null while in progress."""
    imported: ImportOutcome | None
    """The workspace import ``--import-pairs`` performed, when given."""
    progress_file: str
    """Where progress is saved."""


def onboarding_job(request: OnboardingRequest, ctx: JobContext) -> OnboardingResult:
    """``ster onboarding``: show the walkthrough, import a set to finish it, or say it is already done."""
    if request.name is not None and request.import_pairs is None:
        raise Refusal(f"{flag('name')} names the imported copy, so it needs {flag('import_pairs')} FILE")
    state = OnboardingState() if request.reset else read_state()  # refuse a damaged file before writing
    if request.import_pairs is not None:
        return _import(request.import_pairs, request.name, request.reset, state, ctx)
    if request.reset:
        reset()
        ctx.log("onboarding progress was reset; starting the walkthrough over")
    if state.completed:
        ctx.log(
            f"onboarding is already complete ({state.how}, {state.completed_at}); "
            "run ster onboarding --reset to see the walkthrough again"
        )
        return _result("complete", [], state)
    for number, screen in enumerate(SCREENS, start=1):
        ctx.check_cancelled()
        ctx.log(f"[{number}/{len(SCREENS)}] {screen.title}\n{screen.body}")
    state = state.model_copy(update={"screens_seen": max(state.screens_seen, len(SCREENS))})
    _save_or_warn(state, ctx)
    ctx.log(ENDS_WHEN[0].upper() + ENDS_WHEN[1:])
    return _result("in_progress", list(SCREENS), state)


def _import(
    source: Path, name: str | None, start_over: bool, state: OnboardingState, ctx: JobContext
) -> OnboardingResult:
    """``--import-pairs``: the workspace import (same outcomes and refusals), then completion."""
    outcome = import_pair_set(source, name)  # refuses before anything is written
    ctx.log(outcome.reason)
    if start_over:
        reset()
    if not state.completed:
        state = state.model_copy(update={"completed": True, "completed_at": now(), "how": f"imported {outcome.id}"})
        _save_or_warn(state, ctx)
    ctx.log(f"onboarding is complete ({state.how})")
    return _result("complete", [], state, outcome)


def _save_or_warn(state: OnboardingState, ctx: JobContext) -> None:
    """Progress that cannot be saved costs a replay later, not this run."""
    try:
        save(state)
    except Refusal as exc:  # the write's own sentence names the file and the reason
        ctx.warn(f"onboarding progress was not saved: {exc}")


def _result(
    status: Literal["in_progress", "complete"],
    screens: list[Screen],
    state: OnboardingState,
    imported: ImportOutcome | None = None,
) -> OnboardingResult:
    return OnboardingResult(
        status=status,
        screens=screens,
        ends_when=ENDS_WHEN,
        completed_at=state.completed_at,
        how=state.how,
        imported=imported,
        progress_file=str(state_path()),
    )
