"""The Generate pane: one prompt unsteered and steered, side by side, and a strength sweep.

``g`` runs two generate jobs on the same prompt and settings, the baseline without a
vector and then the steered one with the Train tab's artifact; their token events stream
into two panels. ``w`` runs a sweep over the listed strengths (0 always included) and
fills a table with each strength's effect and degeneracy, the suggested strengths marked.
The form's fields go to the engine as typed, so a bad number comes back as a refusal in
the message line like any other.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Static

from ster.tui.messages import JobEvent, JobFinished, JobStarted
from ster.tui.runner import JobHandle
from ster.tui.widgets.generate_parts import (
    FAILED,
    StepInput,
    SweepTable,
    TextPanel,
    mean_relative,
    relative_label,
    shown,
    sweep_caption,
)

PROMPT = "question : tell me about the town . answer :"
"""A prompt in the toy model's vocabulary, so the pane shows steering before anything is typed."""
NO_ARTIFACT = "no artifact: train, optimize or load one in the Train tab"


class GeneratePane(Vertical):
    """Steered against unsteered text, and which strength to use."""

    DEFAULT_CSS = """
    GeneratePane .form { height: auto; }
    GeneratePane .form Label { padding: 1 1 0 0; }
    GeneratePane .form Input { width: 1fr; }
    GeneratePane .form Input.number { width: 10; }
    GeneratePane .form Input#strengths { width: 1fr; min-width: 14; }
    GeneratePane #progress-row { height: 1; margin: 1 0 0 0; }
    GeneratePane #progress-row Label { width: 1fr; padding: 0 1; }
    GeneratePane #message { height: auto; padding: 0 1; }
    GeneratePane #panels { height: 1fr; min-height: 6; }
    GeneratePane #caption { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("g", "generate", "Generate", tooltip="The prompt unsteered and steered, side by side"),
        Binding("]", "step(1)", "Strength +1", tooltip="Raise the strength by 1"),
        Binding("[", "step(-1)", "Strength -1", tooltip="Lower the strength by 1 (negative steers the other way)"),
        Binding("}", "step(0.1)", "Strength +0.1", show=False, tooltip="Raise the strength by 0.1"),
        Binding("{", "step(-0.1)", "Strength -0.1", show=False, tooltip="Lower the strength by 0.1"),
        Binding("w", "sweep", "Sweep", tooltip="Generate at every sweep strength; effect and degeneracy of each"),
        Binding("p", "edit_prompt", "Edit prompt", show=False, tooltip="Type in the prompt (escape leaves it)"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.jobs: dict[str, JobHandle] = {}
        """This pane's queued or running job per role (baseline, steered, sweep). Kept here rather than read
        from the handles' state, which the app sets only once a message has bubbled up to it."""
        self._lines: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        with Horizontal(classes="form"):
            yield Label("prompt (p)")
            yield Input(PROMPT, id="prompt")
            yield Button("Generate (g)", variant="primary", id="generate-button")
        with Horizontal(classes="form"):
            yield from self._field("strength", StepInput("3.0", type="number", id="strength", classes="number",
                                                         tooltip="]/[ step by 1, }/{ by 0.1; negative steers the "
                                                                 "other way"))
            yield from self._field("max tokens", Input("48", type="integer", id="max-new-tokens", classes="number"))
            yield from self._field("temperature", Input("0.0", type="number", id="temperature", classes="number",
                                                        tooltip="0 decodes greedily"))
            yield from self._field("seed", Input("42", type="integer", id="seed", classes="number"))
            yield from self._field("sweep", Input("-6,-3,3,6", id="strengths",
                                                  tooltip="comma list of strengths; 0 is always added"))
            yield Button("Sweep (w)", id="sweep-button")
        with Horizontal(id="progress-row"):
            yield ProgressBar(total=100, show_eta=False, id="progress")
            yield Label("", id="stage")
        yield Static("", id="message")
        with Horizontal(id="panels"):
            yield TextPanel("unsteered", "g generates the prompt without steering here…", id="baseline")
            yield TextPanel("steered", "…and here with the Train tab's artifact, at the strength above "
                                       "(] and [ change it)", id="steered")
        yield Static("w sweeps the strengths above on this prompt", id="caption")
        yield SweepTable(id="sweep")

    @staticmethod
    def _field(label: str, field: Input) -> ComposeResult:
        yield Label(label)
        yield field

    # --- actions ------------------------------------------------------------------------------

    def action_generate(self) -> None:
        if self._busy("baseline", "steered"):
            return
        self._say("", "")
        vector = self.app.settings.vector  # type: ignore[attr-defined]
        self.panel("baseline").reset("unsteered", "waiting for the model…")
        self.panel("steered").reset(f"steered at strength {shown(self._value('strength'))}",
                                    "queued: runs after the unsteered text")
        fields = self._generate_fields()
        if not self._start("baseline", "generate", fields):
            self.panel("steered").note("not run", "dim")
        elif vector is None:
            self.panel("steered").reset("steered", NO_ARTIFACT)
            self._say(NO_ARTIFACT, "yellow")
        else:
            self._start("steered", "generate", {**fields, "vector": vector})

    def action_sweep(self) -> None:
        if self._busy("sweep"):
            return
        self._say("", "")
        vector = self.app.settings.vector  # type: ignore[attr-defined]
        if vector is None:
            self._say(NO_ARTIFACT, "yellow")
            return
        strengths = [s.strip() for s in self._value("strengths").split(",") if s.strip()]
        fields = {**self._generate_fields(), "vector": vector, "strengths": strengths}
        fields["prompt_texts"] = [fields.pop("prompt")]
        del fields["strength"]
        handle = self._start("sweep", "sweep", fields)
        if handle:
            strengths = [s.value for s in handle.request.strengths]  # type: ignore[attr-defined]
            self.query_one(SweepTable).begin(strengths)
            self.query_one("#caption", Static).update(f"sweeping {len(strengths)} strengths (0 included)…")

    def action_step(self, step: float) -> None:
        """Nudge the strength in the form (the next ``g`` uses it); negative values are allowed."""
        field = self.query_one("#strength", Input)
        try:
            value = float(field.value)
        except ValueError:
            self._say(f'strength "{field.value}" is not a number', "red")
            return
        field.value = f"{round(value + step, 6):g}"

    def action_edit_prompt(self) -> None:
        self.query_one("#prompt", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "sweep-button":
            self.action_sweep()
        else:
            self.action_generate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the sweep field sweeps; enter in any other field generates."""
        if event.input.id == "strengths":
            self.action_sweep()
        else:
            self.action_generate()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a sweep row takes its strength into the form, ready for ``g``."""
        strength = self.query_one(SweepTable).strengths.get(str(event.row_key.value))
        if strength is not None:
            self.query_one("#strength", Input).value = f"{strength:g}"
            self._say(f"strength set to {strength:g}; g generates at it", "green")

    def _generate_fields(self) -> dict[str, Any]:
        """The form as typed; the request model parses the numbers and refuses bad ones."""
        return {"prompt": self._value("prompt"), "strength": self._value("strength"),
                "max_new_tokens": self._value("max-new-tokens"), "temperature": self._value("temperature"),
                "seed": self._value("seed"), **self.app.settings.model_fields()}  # type: ignore[attr-defined]

    def _value(self, field: str) -> str:
        return self.query_one(f"#{field}", Input).value.strip()

    def _busy(self, *roles: str) -> bool:
        """Whether one of these roles still runs; a second press would only queue behind it."""
        if any(role in self.jobs for role in roles):
            self._say("still running: wait for it, or cancel it with ctrl+x", "yellow")
            return True
        return False

    def _start(self, role: str, job: str, fields: dict[str, Any]) -> JobHandle | None:
        handle = self.app.start_job(job, fields, self)  # type: ignore[attr-defined]
        if handle is not None:
            self.jobs[role] = handle
        return handle

    # --- rendering the jobs' events -------------------------------------------------------------

    def panel(self, role: str) -> TextPanel:
        return self.query_one(f"#{role}", TextPanel)

    def _role(self, handle: JobHandle) -> str | None:
        """Which of this pane's current jobs a message belongs to; a request refused before it became
        a job has no handle of its own, so its job name says."""
        if handle.id == 0:
            return "baseline" if handle.name == "generate" else "sweep"
        return next((role for role, mine in self.jobs.items() if mine is handle), None)

    def on_job_started(self, message: JobStarted) -> None:
        role = self._role(message.handle)
        if role in ("baseline", "steered"):
            self.panel(role).note("generating…")
            self.panel(role).add_class("running")

    def on_job_event(self, message: JobEvent) -> None:
        event, role = message.event, self._role(message.handle)
        if role is None:
            return
        if event.type == "token":
            self._token(role, event, message.handle)
        elif event.type == "progress":
            self.query_one(ProgressBar).update(total=event.total, progress=event.current or 0)
            self.query_one("#stage", Label).update(event.message)
        elif event.type == "warning":
            self._add(f"warning: {event.message}", "yellow")

    def _token(self, role: str, event: Any, handle: JobHandle) -> None:
        if role == "sweep":
            self.query_one(SweepTable).stream(event.stream, event.text)
            return
        self.panel(role).append(event.text)
        self.query_one(ProgressBar).update(total=handle.request.max_new_tokens,  # type: ignore[attr-defined]
                                           progress=event.index + 1)

    def on_job_finished(self, message: JobFinished) -> None:
        role, final = self._role(message.handle), message.final
        if role is None:
            return
        self.jobs.pop(role, None)
        if role != "sweep":
            self.panel(role).remove_class("running")
        if final.type == "error":
            self._failed(role, final.kind, final.message)  # type: ignore[union-attr]
        elif role == "sweep":
            self._swept(final.data)  # type: ignore[union-attr]
        else:
            self._generated(role, final.data)  # type: ignore[union-attr]
        self._settle()

    def _failed(self, role: str, kind: str, sentence: str) -> None:
        """A refusal or failure goes to the message line in red; the affected output is marked."""
        cancelled = kind == "cancelled"
        if not cancelled:
            self._add(sentence, "red")
        if role == "sweep":
            self.query_one("#caption", Static).update(Text(f"sweep {FAILED[kind]}", "yellow" if cancelled else "red"))
            return
        panel = self.panel(role)
        panel.border_title = f"{panel.border_title} ({FAILED[kind]})"
        if not panel.text:
            panel.note(*(("nothing generated", "dim") if cancelled else (sentence, "red")))

    def _generated(self, role: str, data: dict[str, Any]) -> None:
        self.app.settings.chat_decision = data["chat_template"]  # type: ignore[attr-defined]
        panel = self.panel(role)
        if role == "steered":
            relative = mean_relative(data["relative_strength"])
            panel.border_title = f"steered at strength {data['strength']:g} ({relative_label(relative)})"
        panel.border_subtitle = f"{data['tokens']} tokens, stopped at {data['stop_reason'].replace('_', ' ')}"
        if not data["text"]:
            panel.note("(empty: the model ended the text at once)")

    def _swept(self, data: dict[str, Any]) -> None:
        self.app.settings.chat_decision = data["chat_template"]  # type: ignore[attr-defined]
        self.query_one(SweepTable).fill(data)
        self.query_one("#caption", Static).update(sweep_caption(data))

    def _settle(self) -> None:
        """Once none of this pane's jobs is left, the progress row stops moving."""
        if not self.jobs:
            self.query_one("#stage", Label).update("")
            self.query_one(ProgressBar).update(total=100, progress=100)

    # --- the message line -----------------------------------------------------------------------

    def _say(self, text: str, style: str) -> None:
        self._lines = []
        if text:
            self._add(text, style)
        else:
            self.query_one("#message", Static).update("")

    def _add(self, text: str, style: str) -> None:
        """One more line under the form; the same sentence from two jobs shows once."""
        if (text, style) not in self._lines:
            self._lines.append((text, style))
        self.query_one("#message", Static).update(Text("\n").join(Text(*line) for line in self._lines))
