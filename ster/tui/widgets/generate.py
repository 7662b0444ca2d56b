"""The Generate pane: one prompt through the base model, an adapter and a steering artifact, side by side,
and a strength sweep.

``g`` runs generate jobs on the same prompt and settings, one after another through the
app's runner: first the steered one with the Train tab's artifact, then, when the adapter
field names a LoRA adapter, the adapter alone, then the unsteered base model. Steered goes
first because it is the one that can be refused (an artifact for another model, a relative
strength on an artifact without norms, an adapter trained for another model), and it is
refused before it decodes a token, so nothing is generated for a run that cannot happen;
a run that fails or is cancelled leaves the ones after it "not run". The unsteered requests
carry no strength and no mode, since they apply no artifact. With an adapter, the steered run applies
the artifact on the adapted model by default; ``o`` switches it to the base model and back,
and the steered panel's title says which ran. Without an adapter the pane shows two panels,
unsteered and steered. ``w`` sweeps the listed strengths (0 is always added) into a table
of effect and degeneracy, on the model the steered text runs on (adapted or not), on the
prompt above or on the prompt set named under "prompts": only several prompts give an
effect a noise to be told apart from, so only they can suggest a strength. Enter on a row
shows its outputs whole. Strengths are relative to each layer's activation spread by default
(``0.4x``); the step keys move in the field's own unit. The mode says what the steered run and
the sweep do with the direction: add it, ablate it (the strength a weight) or clamp it (the
strength a target); see :mod:`ster.tui.widgets.generate_mode`. ``c`` copies and ``s`` saves
what the pane shows.

The adapter field starts at the app's current adapter and follows it when another tab
chooses one; typed here, it changes what this pane runs only. Empty (or ``none``) runs no
adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Select, Static

from ster.engine.protocol.jobs import request_default
from ster.engine.steering.intervention import MODES
from ster.engine.steering.strength import DEFAULT_STRENGTH, DEFAULT_SWEEP
from ster.tui.runner import JobHandle
from ster.tui.widgets.fields import Field, FieldErrors, FormRow, checked_by, labelled
from ster.tui.widgets.generate_jobs import GenerateJobs
from ster.tui.widgets.generate_mode import (
    CHECKED_BESIDE,
    MODE_TIP,
    STRENGTH_TIPS,
    SWEEP_HINTS,
    GenerateMode,
    mode_fields,
    untyped_strength,
)
from ster.tui.widgets.generate_parts import NOUNS, TextPanel, applied, mode_words
from ster.tui.widgets.generate_text import GenerateText
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.sweep_table import SweepTable
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import parse_adapter, parse_prompt_set, parse_strength

PROMPT = "question : tell me about the town . answer :"
"""A prompt in the toy model's vocabulary, so the pane shows steering before anything is typed."""
NO_ARTIFACT = "no artifact: train, optimize or load one in the Train tab"
STEP_KEYS = frozenset("[]{}")
FIELDS = ("prompt", "strength", "max-new-tokens", "temperature", "seed", "adapter")
PROMPTS_TIP = (
    "a prompt-set file, or ster:prompts; empty: the prompt above alone. Several prompts give the "
    "effect a noise to be judged against, so only they can suggest a strength"
)
ADAPTER_TIP = (
    "a: a LoRA adapter (.safetensors, its .json sidecar beside it) or a PEFT adapter directory, shown "
    "beside the base model; empty: none. Starts at the app's current adapter"
)


class GeneratePane(GenerateJobs, GenerateText, GenerateMode, FieldErrors, Vertical):
    """Steered against unsteered text, and which strength to use."""

    DEFAULT_CSS = """
    GeneratePane #prompt { width: 1fr; }
    GeneratePane #mode { width: 10; }
    GeneratePane #adapter { width: 1fr; min-width: 12; }
    GeneratePane #steer-hint { padding: 0 0 0 1; color: $text-muted; }
    GeneratePane #message { height: auto; padding: 0 1; display: none; }
    GeneratePane #panels { height: 1fr; min-height: 5; }
    GeneratePane #caption, GeneratePane #fluent-rule { height: auto; padding: 0 1; }
    """
    BINDINGS = [
        Binding("g", "generate", "Generate", tooltip="The prompt steered and unsteered, side by side"),
        Binding(
            "]",
            "step(1, False)",
            "Stronger",
            tooltip="Raise the strength a step (0.1x; 1 if absolute; 0.1 for a weight)",
        ),
        Binding("[", "step(-1, False)", "Weaker", tooltip="Lower the strength a step (negative steers the other way)"),
        Binding("}", "step(1, True)", "Stronger, fine", show=False, tooltip="Raise it a small step (0.01x; 0.1; 0.01)"),
        Binding("{", "step(-1, True)", "Weaker, fine", show=False, tooltip="Lower it a small step (0.01x; 0.1; 0.01)"),
        Binding(
            "o",
            "steer_on",
            "Base/adapter",
            show=False,
            tooltip="Steer on the adapter or on the base model (with an adapter named above; the steered title "
            "says which)",
        ),
        Binding("w", "sweep", "Sweep", tooltip="Generate at every sweep strength; effect and degeneracy of each"),
        Binding("c", "copy", "Copy", tooltip="Copy the texts (or the focused panel's, or the sweep row's)"),
        Binding("s", "save", "Save", tooltip="Save the texts (or the focused panel's, or the sweep row's) to a file"),
        Binding("p", "edit_prompt", "Edit prompt", show=False, tooltip="Type in the prompt (escape leaves it)"),
        Binding(
            "a",
            "edit_adapter",
            "Edit adapter",
            show=False,
            tooltip="Type the adapter's path (empty: none; escape leaves it)",
        ),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.jobs: dict[str, JobHandle] = {}
        """This pane's queued or running job per role (steered, baseline, sweep). Kept here rather than read
        from the handles' state, which the app sets only once a message has bubbled up to it."""
        self._lines: list[tuple[str, str]] = []
        self.queued: list[tuple[str, dict[str, Any]]] = []
        """The runs (role, request fields) still to start, each once the one before it has succeeded."""
        self.steer_on_adapter = True
        """Whether the steered run applies the artifact on the adapter (when one is named) or on the base."""
        self.mode = request_default("generate", "mode")
        """What the steered run and the sweep do with the direction: add, ablate or clamp (the form's selector)."""
        self.ran: dict[str, Any] = {"adapter": None, "on": None, "mode": self.mode}
        """What the last ``g`` ran: its adapter (None: none), what the steered text was steered on (the
        adapter's name, ``the base``, or None without an adapter) and in which mode, so titles say what ran, not
        what is typed."""
        self.caption = Text()
        self.prompt_used = ""
        """The prompt of the texts the panels show (the field may have changed since)."""
        self.sweep_source: str | None = None
        """The prompt set of the last sweep as the field named it; None for the prompt above alone."""
        self.sweep_adapter: str | None = None
        """The name of the adapter the last sweep ran through; None for the base model."""
        self.auto_strength = DEFAULT_STRENGTH
        """What the pane itself last put in the strength field (a value there other than it was typed)."""
        self.auto_sweep = DEFAULT_SWEEP
        """What the pane itself last put in the sweep field: the default, or around a calibrated strength."""

    def compose(self) -> ComposeResult:
        with FormRow():
            yield from labelled("prompt", Field(PROMPT, id="prompt", tooltip="p types here; enter generates"))
            yield from labelled(
                " mode",
                Select(
                    [(mode, mode) for mode in MODES],
                    value=self.mode,
                    allow_blank=False,
                    compact=True,
                    id="mode",
                    tooltip=MODE_TIP,
                ),
            )
        with FormRow():
            yield from labelled(
                "strength",
                Field(
                    DEFAULT_STRENGTH,
                    check=self.check_strength,
                    width=8,
                    grow=20,
                    passthrough=STEP_KEYS,
                    id="strength",
                    tooltip=STRENGTH_TIPS[self.mode],
                ),
            )
            yield from labelled(
                " max tokens",
                checked_by(
                    "generate",
                    "max_new_tokens",
                    CHECKED_BESIDE,
                    shown=request_default("sweep", "max_new_tokens"),  # a sweep's: quick on a CPU, for both
                    width=6,
                    grow=10,
                    id="max-new-tokens",
                ),
            )
            yield from labelled(
                " temp",
                checked_by(
                    "generate",
                    "temperature",
                    CHECKED_BESIDE,
                    width=5,
                    grow=10,
                    id="temperature",
                    tooltip="temperature: 0 decodes greedily; above 0 samples by the seed",
                ),
            )
            yield from labelled(" seed", checked_by("generate", "seed", CHECKED_BESIDE, width=6, grow=24, id="seed"))
        with FormRow():
            yield from labelled(
                "adapter",
                Field(
                    self._current_adapter(),
                    check=self._check_adapter,
                    id="adapter",
                    placeholder="none",
                    tooltip=ADAPTER_TIP,
                ),
            )
            yield Label("", id="steer-hint")
        with FormRow():
            yield from labelled(
                "sweep",
                Field(
                    DEFAULT_SWEEP,
                    check=self.check_sweep,
                    width=24,
                    grow=44,
                    id="strengths",
                    tooltip="strengths to sweep; 0 is always added",
                ),
            )
            yield from labelled(
                " prompts",
                Field(
                    check=parse_prompt_set,
                    width=19,
                    grow=40,
                    id="prompts",
                    placeholder="this prompt only",
                    tooltip=PROMPTS_TIP,
                ),
            )
            yield Label(SWEEP_HINTS[self.mode], classes="field-hint", id="sweep-hint")
        yield JobProgress("g generates, w sweeps", id="progress")
        yield Wrapped("", id="message")
        with Horizontal(id="panels"):
            yield TextPanel("unsteered", "g generates the prompt without steering here…", id="baseline")
            yield TextPanel("adapter", "…here through the adapter named above…", id="adapted")
            yield TextPanel(
                "steered",
                "…and here with the Train tab's artifact, at the strength above (] and [ change it)",
                id="steered",
            )
        yield Wrapped(
            Text(
                "w sweeps the strengths above on the prompt, or on the prompt set named under prompts "
                "(several prompts can tell an effect from noise)",
                style="dim",
            ),
            id="caption",
        )
        yield Wrapped("", id="fluent-rule")
        yield SweepTable(id="sweep")

    def on_mount(self) -> None:
        self.add_class("-unswept")  # until a sweep begins, its table is only a header (hidden when space is short)
        self._hint_steered()
        self.follow_strength(adopted=self.app.settings.strength is not None)
        if self.app.settings.ablation() is not None:
            self.set_mode("ablate")  # an artifact calibrated to ablate: g ablates as it was calibrated

    def on_input_changed(self, event: Field.Changed) -> None:
        """A fixed field's sentence leaves the message line (as ``FieldErrors`` does: Textual calls each class's
        handler, so this one adds to it); a new adapter shows its panel while none holds a text."""
        if event.input.id == "adapter":
            self._hint_steered()

    # --- actions ------------------------------------------------------------------------------

    def action_generate(self) -> None:
        if self._busy("baseline", "adapted", "steered") or self.first_bad(*FIELDS):
            return
        self.say("", "")
        settings = self.app.settings
        fields, adapter = self._generate_fields(), self._adapter()
        on = self._steered_on(adapter)
        self.ran = {"adapter": adapter, "on": on, "mode": self.mode}
        self.prompt_used = fields["prompt"]
        if adapter is None:  # the adapter's panel goes with its older text: this run has none
            self.panel("adapted").reset("adapter", "")
        self._show_adapted(adapter is not None)
        runs: list[tuple[str, dict[str, Any]]] = []
        if settings.vector is None:
            self.panel("steered").reset("steered", NO_ARTIFACT)
            self.say(NO_ARTIFACT, "yellow")
        else:
            on_adapter = {"adapter": adapter} if adapter is not None and self.steer_on_adapter else {}
            strength = {"strength": self._value("strength")} if self._value("strength") else {}  # empty: calibrated
            edit = mode_fields(self.mode, settings)
            runs.append(("steered", {**fields, "vector": settings.vector, **edit, **strength, **on_adapter}))
        if adapter is not None:
            runs.append(("adapted", {**fields, "adapter": adapter}))
        runs.append(("baseline", fields))
        for at, (role, _) in enumerate(runs):
            before = self.role_name(runs[at - 1][0]) if at else ""
            note = f"runs once the {before} text is done" if before else "waiting for the model…"
            self.panel(role).reset(self.title(role), note)
        (role, first), self.queued = runs[0], runs[1:]
        if not self._start(role, "generate", first):
            self._not_run(f"the {self.role_name(role)} request was refused")

    def action_sweep(self) -> None:
        if self._busy("sweep") or self.first_bad(*FIELDS, "strengths", "prompts"):
            return
        self.say("", "")
        settings = self.app.settings
        if settings.vector is None:
            self.say(NO_ARTIFACT, "yellow")
            return
        adapter = self._adapter() if self.steer_on_adapter else None
        fields = {
            **self._generate_fields(),
            "vector": settings.vector,
            **mode_fields(self.mode, settings),
            "strengths": self._value("strengths"),
            **({"adapter": adapter} if adapter is not None else {}),
        }
        prompt, prompt_set = fields.pop("prompt"), parse_prompt_set(self._value("prompts"))
        fields.update({"prompts": prompt_set} if prompt_set else {"prompt_texts": [prompt]})
        handle = self._start("sweep", "sweep", fields)
        if handle:
            self.sweep_source = self._value("prompts") or None
            self.sweep_adapter = None if adapter is None else adapter_name(adapter)
            from ster.engine.steering.requests import SweepRequest

            strengths = list(handle.requested(SweepRequest).strengths or ())  # the field refuses to be empty
            self.query_one(SweepTable).begin(strengths, self.sweep_adapter, self.mode)
            self.remove_class("-unswept")
            where = f"the prompts of {self.sweep_source}" if self.sweep_source else "the prompt above"
            through = f" through the adapter {self.sweep_adapter}" if adapter is not None else ""
            noun = NOUNS[self.mode]
            self.query_one("#caption", Static).update(
                f"sweeping {settings.artifact_label()}{mode_words(self.mode)}{through} at {len(strengths)} {noun}s "
                f"(0 included) on {where}…"
            )
            self.query_one("#fluent-rule", Static).update("")

    def action_steer_on(self) -> None:
        """Switch what the next steered run (and sweep) applies the artifact on: the adapter or the base model."""
        if self.first_bad("adapter"):
            return
        adapter = self._adapter()
        if adapter is None:
            self.say(
                "no adapter named above, so the steered text runs on the base model; name one under adapter "
                "(a types there) to steer on it",
                "yellow",
            )
            return
        self.steer_on_adapter = not self.steer_on_adapter
        other = "the base model" if self.steer_on_adapter else adapter_name(adapter)
        self.say(f"g now steers on {self._steered_on(adapter)} (o: on {other})", "green")
        self._hint_steered()

    def action_edit_prompt(self) -> None:
        self.query_one("#prompt", Field).focus()

    def action_edit_adapter(self) -> None:
        self.query_one("#adapter", Field).focus()

    def on_input_submitted(self, event: Field.Submitted) -> None:
        """Enter in the sweep's fields sweeps; enter in any other field generates."""
        self.action_sweep() if event.input.id in ("strengths", "prompts") else self.action_generate()

    def on_data_table_row_selected(self) -> None:
        """Enter on a sweep row opens it whole; from there ``u`` takes its strength into the form."""
        from ster.tui.screens.sweep_row import SweepRowDialog

        table = self.query_one(SweepTable)
        key = table.highlighted_key()
        if key is None or key not in table.strengths:
            return
        trait = (self.app.settings.artifact or {}).get("trait_name", "the trait")
        strength, mode = table.strengths[key], table.mode
        self.app.push_screen(
            SweepRowDialog(strength, table.rows_data.get(key), table.streamed(key), trait, mode),
            lambda answer: self._use_strength(strength, mode) if answer == "use" else None,
        )

    def _use_strength(self, strength: str, mode: str) -> None:
        """A sweep row's strength into the form, in the sweep's mode (a weight is no push)."""
        switched = mode != self.mode
        self.set_mode(mode)
        self.query_one("#strength", Field).value = strength
        self.say(f"strength set to {strength}{f', mode {mode}' if switched else ''}; g generates at it", "green")

    def _generate_fields(self) -> dict[str, Any]:
        """The form as typed (checked already), less the strength and the mode, which only a steered request
        carries (the engine warns that a strength without an artifact has no effect); the request model parses the
        numbers."""
        return {
            "prompt": self._value("prompt"),
            "max_new_tokens": self._value("max-new-tokens"),
            "temperature": self._value("temperature"),
            "seed": self._value("seed"),
            **self.app.settings.model_fields(),
        }

    def _value(self, field: str) -> str:
        return self.query_one(f"#{field}", Field).value.strip()

    def _adapter(self) -> Path | None:
        """The adapter the field names (checked already); None for none."""
        return self._check_adapter(self._value("adapter"))

    def _check_adapter(self, text: str) -> Path | None:
        return parse_adapter(text, local=getattr(self.app, "remote", None) is None)

    def _current_adapter(self) -> str:
        """The app's current adapter as the field shows it (empty: none)."""
        adapter = self.app.settings.adapter
        return "" if adapter is None else str(adapter)

    def _steered_on(self, adapter: Path | None) -> str | None:
        """What a steered run with this adapter applies the artifact on: its name, ``the base``; None without one."""
        if adapter is None:
            return None
        return adapter_name(adapter) if self.steer_on_adapter else "the base"

    def _show_adapted(self, shown: bool) -> None:
        """The adapter's panel shows while an adapter is named or the panel holds a text of one."""
        panel = self.panel("adapted")
        panel.display = shown or bool(panel.text)
        self.set_class(panel.display, "-three")

    def _hint_steered(self) -> None:
        """Before a run, the empty panels say what ``g`` will run there."""
        adapter = self._adapter() if self.query_one("#adapter", Field).error() is None else None
        on, other = ("it", "the base") if self.steer_on_adapter else ("the base", "it")
        hint = "" if adapter is None else f"steered runs on {on} (o: on {other})"
        self.query_one("#steer-hint", Label).update(hint)
        self.query_one("#steer-hint", Label).styles.width = len(hint) + 1 if hint else 0  # auto keeps its old width
        if not any(self.panel(role).text or role in self.jobs for role in ("baseline", "adapted", "steered")):
            self._show_adapted(adapter is not None)
            if adapter is None:  # the two panels of a run without an adapter, with their first hints
                for role, title in (("baseline", "unsteered"), ("steered", "steered")):
                    self.panel(role).reset(title, self.panel(role).hint)
                return
            self.panel("baseline").reset(
                f"base · {model_name(self.app.settings.model)}",
                "g generates the prompt on the base model here…",
            )
            self.panel("adapted").reset(f"adapter · {adapter_name(adapter)}", "…here through the adapter…")
            self.panel("steered").reset(
                "steered",
                f"…and here with the Train tab's artifact on "
                f"{self._steered_on(adapter)} (o switches), at the strength above",
            )

    def role_name(self, role: str) -> str:
        """How the progress line and the panels' notes name a run: with an adapter, the unsteered run is the base."""
        if role == "baseline":
            return "base" if self.ran["adapter"] is not None else "unsteered"
        return {"adapted": "adapter"}.get(role, role)

    def title(self, role: str, strength: str | None = None) -> str:
        """A panel's title: exactly what its run runs (the model, the adapter, the artifact and where it steers)."""
        settings = self.app.settings
        if role == "baseline":
            return "unsteered" if self.ran["adapter"] is None else f"base · {model_name(settings.model)}"
        if role == "adapted":
            return f"adapter · {adapter_name(self.ran['adapter'])}"
        typed, mode = self._value("strength"), self.ran["mode"]
        strength = strength or (shown_strength(typed) if typed else untyped_strength(mode, settings, named=True))
        title = f"{applied(mode, strength)} · {settings.artifact_label()}"
        return title if self.ran["on"] is None else f"{title} on {self.ran['on']}"

    def _busy(self, *roles: str) -> bool:
        """Whether one of these roles still runs; a second press would only queue behind it."""
        if any(role in self.jobs for role in roles):
            self.say("still running: wait for it, or cancel it with ctrl+x", "yellow")
            return True
        return False

    def _start(self, role: str, job: str, fields: dict[str, Any]) -> JobHandle | None:
        handle = self.app.start_job(job, fields, self)
        if handle is not None:
            self.jobs[role] = handle
            self.query_one(JobProgress).queued(handle, self.role_name(role))
        return handle

    # --- the message line -----------------------------------------------------------------------

    def say(self, text: str, style: str) -> None:
        self.shown_error, self._lines = None, []
        if text:
            self.add(text, style)
        else:
            self.query_one("#message", Static).update("")
            self.query_one("#message", Static).display = False

    def add(self, text: str, style: str) -> None:
        """One more line under the form; the same sentence from two jobs shows once."""
        if (text, style) not in self._lines:
            self._lines.append((text, style))
        self._show_lines()

    def drop(self, text: str, style: str) -> None:
        """Take a line back off (one that another part of the pane now says)."""
        if (text, style) in self._lines:
            self._lines.remove((text, style))
            self._show_lines()

    def _show_lines(self) -> None:
        message = self.query_one("#message", Static)
        message.update(Text("\n").join(Text(*line) for line in self._lines))
        message.display = bool(self._lines)


def adapter_name(path: Path | None) -> str:
    """An adapter as titles name it: its file name without ``.safetensors`` (a PEFT directory's name)."""
    return "none" if path is None else path.name.removesuffix(".safetensors")


def model_name(model: str) -> str:
    """A model as the base panel's title names it: the last part of its path or Hub id (the status line has all)."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def shown_strength(typed: str) -> str:
    """A typed strength as the engine reads it (0.40x shows as 0.4x); anything else as typed."""
    try:
        return str(parse_strength(typed))
    except ValueError:
        return typed
