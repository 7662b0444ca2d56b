"""The Tune pane: train a LoRA adapter (sft, dpo, ipo, reward, grpo), watch its curves, cancel and resume it.

The form builds the fields of a ``tune`` job and the app starts it (see :meth:`SterApp.start_job`); the
settings most runs leave alone (seed, layers, warmup, checkpoints, sequence limit, batch, grpo's sampling)
sit in a folded "more settings" section whose title names any that differ from the defaults;
the pane renders the job's events: the progress line, every optimizer step as a point of the
curves (:mod:`ster.tui.widgets.curves`), and at the end the report's summary and the adapter's
path. Cancelling (ctrl+x) leaves the engine's checkpoint beside the output, ``<output>.checkpoint``;
``r`` runs the same fields again with ``resume`` and the run ends where an uninterrupted one would.
An adapter the person does not name goes to the workspace's artifact directory, named after the
trait (or the data file), the objective and the model.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Collapsible, Input, Label, Select

from ster.tui.adapters import checkpoint_of
from ster.tui.messages import JobEvent, JobFinished, JobStarted, SettingsChanged
from ster.tui.paths import default_adapter, shown
from ster.tui.runner import final_state
from ster.tui.widgets.curves import Curves
from ster.tui.widgets.fields import Field, FieldErrors, FormRow, MessageLine, labelled
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import LABELS, Labels, in_our_words, request_check, said

if TYPE_CHECKING:
    from ster.engine.tune.requests import TuneRequest

OBJECTIVES = ("sft", "dpo", "ipo", "reward", "grpo")
JOBS = {"sft": "tune sft", "dpo": "tune dpo", "ipo": "tune dpo", "reward": "tune reward", "grpo": "tune grpo"}
DATA = {"sft": "examples", "dpo": "pairs", "ipo": "pairs", "reward": "pairs", "grpo": "prompts"}
"""The data field's name (and label) per objective."""
BUNDLED = {"examples": "ster:examples", "pairs": "ster:pairs", "prompts": "ster:grpo-prompts"}
"""The bundled data of each kind: what the field's placeholder offers, and what a field is checked beside."""
FORM = ("epochs", "learning-rate", "accumulation", "rank", "alpha", "targets", "beta", "group", "reward")
"""The form's settings above the fold (ids: the CLI flag without its dashes)."""
MORE = {
    "seed": "seed",
    "layers": "layers",
    "warmup-steps": "warmup steps",
    "checkpoint-every": "checkpoint every",
    "max-sequence": "max sequence",
    "batch-size": "batch",
    "temperature": "temperature",
    "top-p": "top-p",
    "max-new-tokens": "max new tokens",
}
"""The fields under "more settings" (id, the CLI flag without its dashes → label), in the order they are shown."""
SAMPLING = ("temperature", "top-p", "max-new-tokens")
"""grpo's sampling of its completions; the batch is every other objective's (grpo decodes a group as one batch)."""
MORE_TITLE = "more settings"
RESUME_HINT = "r resumes the run from its checkpoint (the same fields), t starts over"


def request_field(objective: str, name: str) -> str:
    """The request field a form field sets: its id's words (grpo's epochs are its iterations)."""
    return "iterations" if name == "epochs" and objective == "grpo" else name.replace("-", "_")


def request_kind(objective: str) -> type[TuneRequest]:
    """The request model of an objective's job: the one source of the form's defaults and checks."""
    from ster.engine.protocol.jobs import request_class

    return cast("type[TuneRequest]", request_class(JOBS[objective]))


@cache
def own_defaults(objective: str) -> dict[str, str]:
    """The form's fields this objective's request has, at that request's defaults."""
    from ster.engine.protocol.jobs import request_default

    fields = request_kind(objective).model_fields
    return {
        name: request_default(JOBS[objective], request_field(objective, name))
        for name in (*FORM, *MORE)
        if request_field(objective, name) in fields
    }


@cache
def defaults(objective: str) -> dict[str, str]:
    """Every field's default as the form shows it for ``objective``: its request's own, and for a field its
    request lacks (grpo's group under sft) the first objective's that has it, so a hidden field holds a value
    that is right once it shows."""
    shown: dict[str, str] = {}
    for other in (objective, *OBJECTIVES):
        shown = {**own_defaults(other), **shown}
    return shown


@cache
def valid(objective: str) -> dict[str, Any]:
    """The fields of a request of ``objective`` that passes every check: what one field is checked beside."""
    data = DATA[objective]
    return {
        "model": "ster:toy",
        "output": Path("adapter.safetensors"),
        data: BUNDLED[data],
        **({"loss": objective} if objective in ("dpo", "ipo") else {}),
    }


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class MoreSettings(Collapsible):
    """The settings most runs leave at their defaults, folded under one line that names those changed."""

    SCOPED_CSS = False  # its rules follow the screen's -short class, as the form rows' do
    DEFAULT_CSS = """
    MoreSettings { background: transparent; border-top: none; padding: 0; }
    MoreSettings.-collapsed { margin-bottom: 1; }  /* open, its last row's margin is the gap */
    MoreSettings:focus-within { background-tint: $foreground 0%; }
    MoreSettings CollapsibleTitle { padding: 0 1 0 0; color: $text-muted; }
    MoreSettings Contents { padding: 1 0 0 2; }
    Screen.-short MoreSettings { margin-bottom: 0; }
    Screen.-short MoreSettings Contents { padding: 0 0 0 2; }
    """


class TunePane(MessageLine, FieldErrors, Vertical):
    """Train an adapter: the form, the progress line, the curves, the report."""

    DEFAULT_CSS = """
    TunePane Select { width: 12; }
    TunePane #data, TunePane #output, TunePane #reward { width: 1fr; }
    TunePane .grpo-only, TunePane .beta-only { display: none; }
    TunePane.-grpo .grpo-only, TunePane.-beta .beta-only { display: block; }
    TunePane.-grpo .no-grpo { display: none; }
    TunePane #message { height: auto; padding: 0 1; display: none; }
    """
    BINDINGS = [
        Binding("t", "tune", "Train adapter", tooltip="Train a LoRA adapter with these fields (ctrl+x cancels)"),
        Binding("r", "resume", "Resume", tooltip="Continue the cancelled run from its checkpoint beside the adapter"),
        Binding("c", "cycle", "Curve", tooltip="Cycle the value drawn beside the loss"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.objective = "sft"
        self.report: dict[str, Any] | None = None
        """The last finished run's result document (``path`` and ``report``)."""
        self._skips = 0
        self.objectives: dict[int, str] = {}
        """The objective of each run this pane started, by job id (the form may have switched since)."""
        self._typed: dict[str, str] = {}
        """The data field's text per kind of data (examples, pairs, prompts), kept across objective switches."""

    def compose(self) -> ComposeResult:
        with FormRow():
            yield Label("objective", classes="field-label")
            yield Select([(o, o) for o in OBJECTIVES], value="sft", allow_blank=False, compact=True, id="objective")
            yield Label("examples", classes="field-label -gap", id="data-label")
            yield Field(id="data", tooltip="the training data: a file, or a bundled name such as ster:examples")
        with FormRow():
            yield from labelled(
                "adapter",
                Field(
                    id="output",
                    tooltip="where t writes the adapter (.safetensors) and its sidecar; empty: the default in grey",
                ),
            )
        with FormRow():
            yield Label("epochs", classes="field-label", id="epochs-label")
            yield self._setting("epochs", 5, 8)
            yield Label("learning rate", classes="field-label -gap")
            yield self._setting("learning-rate", 9, 14)
            yield Label("accumulation", classes="field-label -gap")
            yield self._setting("accumulation", 5, 8, "forwards folded into one optimizer step")
        with FormRow():
            yield from labelled("rank", self._setting("rank", 5, 8))
            yield Label("alpha", classes="field-label -gap")
            yield self._setting("alpha", 6, 10)
            yield Label("targets", classes="field-label -gap")
            yield self._setting(
                "targets", 14, 40, "query, key, value, output, gate, up, down (or q_proj …), comma separated"
            )
            yield Label("beta", classes="field-label -gap beta-only")
            yield self._setting("beta", 6, 10, classes="beta-only")
        with FormRow(classes="grpo-only"):
            yield from labelled("group", self._setting("group", 5, 8, "completions sampled per prompt"))
            yield Label("reward", classes="field-label -gap")
            yield self._setting(
                "reward", None, None, "length (tokens emitted), or a reward model written by tune reward"
            )
        with MoreSettings(title=MORE_TITLE, id="more"):
            with FormRow():
                yield from labelled(
                    "seed",
                    self._setting(
                        "seed",
                        6,
                        24,
                        "the adapter's initial factors and the order of the data (grpo: its sampling too)",
                    ),
                )
                yield Label("layers", classes="field-label -gap")
                yield self._setting("layers", 6, 24, "layers that carry an adapter: all, or such as 2,5 or 8-15")
                yield Label("warmup steps", classes="field-label -gap")
                yield self._setting("warmup-steps", 5, 8, "optimizer steps over which the learning rate ramps up")
            with FormRow():
                yield from labelled(
                    "checkpoint every",
                    self._setting(
                        "checkpoint-every",
                        5,
                        8,
                        "write a resumable checkpoint every this many steps; 0: only when cancelled",
                    ),
                )
                yield Label("max sequence", classes="field-label -gap")
                yield self._setting("max-sequence", 6, 8, "tokens; a longer sequence is skipped, never cut")
                yield Label("batch", classes="field-label -gap no-grpo")
                yield self._setting(
                    "batch-size", 5, 8, "units per forward (grpo decodes each prompt's group as one)", "no-grpo"
                )
            with FormRow(classes="grpo-only"):
                yield from labelled(
                    "temperature",
                    self._setting("temperature", 6, 10, "sampling temperature of the completions, above zero"),
                )
                yield Label("top-p", classes="field-label -gap")
                yield self._setting("top-p", 6, 10, "nucleus sampling: 1 keeps every token")
                yield Label("max new tokens", classes="field-label -gap")
                yield self._setting("max-new-tokens", 5, 8, "tokens sampled per completion at most")
        yield JobProgress("t trains an adapter; ctrl+x cancels and keeps a checkpoint, r resumes it", id="progress")
        yield Wrapped("", id="message")
        yield Curves(id="curves")

    def _setting(self, name: str, width: int | None, grow: int | None, tooltip: str = "", classes: str = "") -> Field:
        """A setting's field, at the request's default and checked by the request's own checks."""
        return Field(
            defaults(self.objective)[name],
            check=lambda text: self._check(name, text),
            width=width,
            grow=grow,
            id=name,
            tooltip=tooltip or None,
            classes=classes,
        )

    def _check(self, name: str, text: str) -> None:
        """Refuse a field's text as the objective's request would, beside a request that passes: in the
        request's sentence, naming the field as this form labels it (ValueError)."""
        field, objective = request_field(self.objective, name), self.objective
        if field in request_kind(objective).model_fields:  # not a field of another objective, hidden under this one
            request_check(JOBS[objective], field, valid(objective), self.names)(text)

    @property
    def names(self) -> Labels:
        """How this tab names the request's fields: its own labels (the data field is named for its kind)."""
        return LABELS.but(
            output="adapter",
            learning_rate="learning rate",
            resume="resume (r)",
            **{data: data for data in BUNDLED},  # examples, pairs, prompts: the data field's label
            **{name.replace("-", "_"): label for name, label in MORE.items()},
        )

    def on_mount(self) -> None:
        self._show_objective()

    # --- the form ------------------------------------------------------------------------------------

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "objective" or event.value == self.objective:
            return
        data = self.query_one("#data", Field)
        self._typed[DATA[self.objective]] = data.value  # each kind of data keeps what was typed for it
        before, self.objective = defaults(self.objective), str(event.value)
        data.value = self._typed.get(DATA[self.objective], "")
        for name, value in defaults(self.objective).items():
            field = self.query_one(f"#{name}", Field)
            if field.value.strip() == before[name]:  # a default follows the objective; a typed value stays
                field.value = value
            else:
                field.validate(field.value)  # checked again, by the new objective's request
        if self.shown_error:
            self.say("", "")
        self._show_objective()

    def _show_objective(self) -> None:
        objective, settings = self.objective, self.app.settings
        self.set_class(objective == "grpo", "-grpo")
        self.set_class(objective in ("dpo", "ipo", "grpo"), "-beta")
        data = DATA[objective]
        self.query_one("#data-label", Label).update(data)
        self.query_one("#epochs-label", Label).update("iterations" if objective == "grpo" else "epochs")
        if data == "pairs":
            pairs = settings.pairs
            hint = f"the Pairs tab's set, {pairs.name}" if pairs else "the workspace's active pair set"
        else:
            hint = f"a file, or {BUNDLED[data]}"
        self.query_one("#data", Field).placeholder = hint
        self.query_one("#output", Field).placeholder = shown(self._default_output())
        self._title_more()

    def _shown_more(self) -> list[str]:
        """The more-settings fields of this objective."""
        skip = ("batch-size",) if self.objective == "grpo" else SAMPLING
        return [name for name in MORE if name not in skip]

    def _title_more(self) -> None:
        """The section's title names what differs from the defaults, so a folded section still says it."""
        changed = [
            f"{MORE[name]} {self.query_one(f'#{name}', Field).value.strip()}"
            for name in self._shown_more()
            if self.query_one(f"#{name}", Field).value.strip() != defaults(self.objective)[name]
        ]
        self.query_one(MoreSettings).title = MORE_TITLE + (": " + ", ".join(changed) if changed else "")

    def _default_output(self) -> Path:
        settings = self.app.settings
        typed = self.query_one("#data", Field).value.strip()
        if typed:
            name = Path(typed.removeprefix("ster:")).stem
        elif DATA[self.objective] == "pairs":
            name = settings.trait or (settings.pairs.stem if settings.pairs else "pairs")
        else:
            name = DATA[self.objective]
        return default_adapter(name, self.objective, settings.model)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "data":
            self.query_one("#output", Field).placeholder = shown(self._default_output())
        elif event.input.id in MORE:
            self._title_more()

    def on_settings_changed(self, message: SettingsChanged) -> None:
        self._show_objective()

    def output(self) -> Path:
        typed = self.query_one("#output", Field).value.strip()
        return Path(typed).expanduser() if typed else self._default_output()

    def fields(self) -> dict[str, Any] | None:
        """The job's fields from the form; None (with the sentence shown) when one is bad."""
        from ster.engine.protocol.errors import Refusal
        from ster.engine.protocol.naming import named
        from ster.engine.protocol.requests import build_request

        objective, settings, kind = self.objective, self.app.settings, request_kind(self.objective)
        own = [name for name in FORM if request_field(objective, name) in kind.model_fields]
        more = [name for name in self._shown_more() if request_field(objective, name) in kind.model_fields]
        if self.first_bad(*own):
            return None
        if self.first_bad(*more):
            self.query_one(MoreSettings).collapsed = False  # the bad field in sight
            return None
        texts = {request_field(objective, name): self.query_one(f"#{name}", Field).value.strip() for name in own + more}
        try:
            with named(self.names):  # each passed alone; read back as the request parses them
                parsed = build_request(kind, **valid(objective), **texts)
        except Refusal as exc:
            self.say(in_our_words(str(exc)), "red")
            return None
        fields: dict[str, Any] = {
            "output": self.output(),
            **{field: getattr(parsed, field) for field in texts},
            **settings.model_fields(),
        }
        data, typed = DATA[objective], self.query_one("#data", Field).value.strip()
        if typed:
            fields[data] = typed if typed.startswith("ster:") else Path(typed).expanduser()
        elif data == "pairs":
            if settings.pairs is not None:
                fields["pairs"] = settings.pairs
        else:
            self.say(f"{data}: name the training data, a file or the bundled {BUNDLED[data]}", "red")
            self.shown_error = "data"  # typing there clears it
            self.query_one("#data", Field).focus()
            return None
        if objective in ("dpo", "ipo"):
            fields["loss"] = objective
        return fields

    # --- actions ---------------------------------------------------------------------------------------

    def action_tune(self) -> None:
        from ster.tui.screens.dialogs import Confirm

        fields = self.fields()
        if fields is None:
            return
        output, local = fields["output"], self.app.remote is None
        checkpoint = checkpoint_of(output)
        if local and checkpoint.exists():
            question = (
                f"An unfinished run's checkpoint is at {shown(checkpoint)}. Start over and replace it? "
                "(r resumes it instead)"
            )
            self.app.push_screen(
                Confirm(question, "Start over", "Keep it"),
                lambda yes: (
                    self._run(fields)
                    if yes
                    else self.say(f"kept {shown(checkpoint)}; nothing ran. {RESUME_HINT}", "yellow")
                ),
            )
        elif local and output.exists():
            self.app.push_screen(
                Confirm(f"{shown(output)} already exists. Replace it with the new adapter?", "Replace", "Keep it"),
                lambda yes: (
                    self._run(fields)
                    if yes
                    else self.say(f"kept {shown(output)}; nothing ran. Name another adapter to keep both", "yellow")
                ),
            )
        else:
            self._run(fields)

    def action_resume(self) -> None:
        fields = self.fields()
        if fields is None:
            return
        checkpoint = checkpoint_of(fields["output"])
        if self.app.remote is None and not checkpoint.exists():
            self.say(
                f"no checkpoint at {shown(checkpoint)} to resume: a run cancelled with ctrl+x leaves one "
                "there; t starts a run",
                "red",
            )
            return
        self._run({**fields, "resume": True})

    def action_cycle(self) -> None:
        name = self.query_one(Curves).cycle()
        if name is None:
            self.app.notify("no other value to draw yet: it comes with the run's steps")

    def _run(self, fields: dict[str, Any]) -> None:
        self.say("", "")
        self._skips = 0
        job = JOBS[self.objective]
        handle = self.app.start_job(job, fields, self)
        if handle is not None:
            self.objectives[handle.id] = self.objective
            self.query_one(JobProgress).queued(handle, f"tune {self.objective}")
            self.query_one(Curves).begin(self.objective, keep=bool(fields.get("resume")))

    # --- rendering the job's events -----------------------------------------------------------------

    def on_job_started(self, message: JobStarted) -> None:
        handle = message.handle
        self.query_one(JobProgress).started(handle, f"tune {self.objectives.get(handle.id, '')}", message.first)

    def on_job_event(self, message: JobEvent) -> None:
        event = message.event
        if message.step is not None:
            self.query_one(JobProgress).stepped(message.handle, message.step)
        if event.type == "progress":
            if event.stage == "train" and event.current is not None and event.data:
                self.query_one(Curves).add(event.current, event.total, event.data)
                # once it trains the curves take the room (a refused run leaves the section as it was);
                # the folded title still says what differs from the defaults
                self.query_one(MoreSettings).collapsed = True
            elif event.stage == "skip":
                self._skips += 1
                if self._skips <= 3:
                    self.add(in_our_words(event.message), "yellow")
        elif event.type == "warning":
            self.add(f"warning: {in_our_words(event.message)}", "yellow")
        elif event.type == "log" and event.data and "checkpoint" in event.data:  # resumed, or started over
            self.add(in_our_words(event.message), "dim")

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        state = final_state(final)
        if handle.id:
            self.query_one(JobProgress).ended(handle, state, getattr(final, "message", ""))
            self.query_one(Curves).flush()
        if final.type == "result":
            self.report = final.data
            self.say(self._summary(self.objectives.get(handle.id, self.objective), final.data), "green")
        elif final.kind == "cancelled":
            self.say(self._cancelled(final.message, final.details), "magenta")
        else:
            self.say(said(final), "red")

    def _cancelled(self, sentence: str, details: dict[str, Any] | None) -> str:
        """A cancelled run in this tab's words: where it stopped and how to go on, from the error's facts."""
        if not details or "checkpoint" not in details:
            return in_our_words(sentence)
        done, total, where = details["step"], details["total"], details["checkpoint"]
        return f"cancelled after step {done} of {total}; {RESUME_HINT}. The checkpoint:\n{shown(Path(where))}"

    @staticmethod
    def _summary(objective: str, data: dict[str, Any]) -> str:
        report, path = data["report"], Path(data["path"])
        passes = report.get("iterations", report.get("epochs"))
        unit = "iteration" if objective == "grpo" else "epoch"
        steps = report["steps"]
        parts = [
            f"{objective} done: {plural(steps, 'step')} over {plural(passes, unit)}, "
            f"loss {report['first_loss']:.4f} → final {report['final_loss']:.4f}"
        ]
        if objective in ("dpo", "ipo"):
            parts.append(f"accuracy {report['accuracy']:.3f}, reward margin {report['mean_reward_margin']:.4f}")
        elif objective == "reward":
            parts.append(f"accuracy {report['accuracy']:.3f}, score margin {report['mean_score_margin']:.4f}")
        elif objective == "grpo":
            parts.append(f"mean reward {report['mean_reward']:.4f}, mean KL {report['mean_kl']:.4f}")
        kind = "reward model" if objective == "reward" else "adapter"
        return ", ".join(parts) + f"\nwrote the {kind} {shown(path)} and its .json sidecar"
