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

import math
from pathlib import Path
from typing import Any

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
from ster.tui.words import in_our_words, parse_whole

OBJECTIVES = ("sft", "dpo", "ipo", "reward", "grpo")
JOBS = {"sft": "tune sft", "dpo": "tune dpo", "ipo": "tune dpo", "reward": "tune reward", "grpo": "tune grpo"}
DATA = {"sft": "examples", "dpo": "pairs", "ipo": "pairs", "reward": "pairs", "grpo": "prompts"}
"""The data field's name (and label) per objective."""
DEFAULTS: dict[str, dict[str, str]] = {
    objective: {
        "epochs": "1",
        "learning-rate": "0.0001",
        "accumulation": "1" if objective == "grpo" else "8",
        "rank": "8",
        "alpha": "16",
        "targets": "query,value",
        "beta": "0.04" if objective == "grpo" else "0.1",
        "group": "4",
        "reward": "length",
        "seed": "42",
        "layers": "all",
        "warmup-steps": "0",
        "batch-size": "1",
        "checkpoint-every": "0",
        "max-sequence": "512",
        "temperature": "0.9",
        "top-p": "0.95",
        "max-new-tokens": "64",
    }
    for objective in OBJECTIVES
}
"""The contract's defaults (the tune requests' own; a test keeps them equal), as the fields show them."""
BUNDLED = {"examples": "ster:examples", "prompts": "ster:grpo-prompts"}
NUMBER_FIELDS = ("epochs", "learning-rate", "accumulation", "rank", "alpha", "beta", "group")
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


def positive(label: str) -> Any:
    def check(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f'{label} is a number such as 0.0001 or 1e-4; "{text}" is not') from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a finite number above zero")
        return value

    return check


def not_negative(label: str) -> Any:
    def check(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f'{label} is a number; "{text}" is not') from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{label} must be a finite number of at least 0")
        return value

    return check


def whole(label: str, low: int, high: int | None = None) -> Any:
    def check(text: str) -> int:
        if not text.strip():
            raise ValueError(f"{label} is empty; give a whole number of at least {low}")
        return parse_whole(text, label, low, high)

    return check


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def nucleus(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f'top-p is a number above 0 and at most 1 (1 keeps every token); "{text}" is not') from None
    if not 0 < value <= 1:
        raise ValueError("top-p must be above 0 and at most 1 (1 keeps every token)")
    return value


def check_layers(text: str) -> str:
    from ster.tui.words import parse_layers

    if not text.strip():
        raise ValueError("layers is empty; give all, or layers such as 2,5 or 8-15")
    return parse_layers(text)


CHECKS: dict[str, Any] = {
    "seed": whole("seed", 0, 2**64 - 1),
    "layers": check_layers,
    "warmup-steps": whole("warmup steps", 0),
    "batch-size": whole("batch", 1),
    "checkpoint-every": whole("checkpoint every", 0),
    "max-sequence": whole("max sequence", 2),
    "temperature": positive("temperature"),
    "top-p": nucleus,
    "max-new-tokens": whole("max new tokens", 1),
}


def check_targets(text: str) -> str:
    from ster.engine.model.adapters.artifact import parse_targets
    from ster.engine.protocol.errors import Refusal

    try:
        parse_targets(text)
    except Refusal as exc:
        raise ValueError(in_our_words(str(exc))) from None
    return text


def tune_words(sentence: str, data: str) -> str:
    """An engine sentence as the Tune tab says it: its fields' labels for the flags."""
    for flag, label in (
        ("--output", "adapter"),
        ("--epochs", "epochs"),
        ("--iterations", "epochs"),
        ("--learning-rate", "learning rate"),
        ("--pairs", "pairs"),
        ("--resume", "resume (r)"),
        *((f"--{name}", label) for name, label in MORE.items()),
    ):
        sentence = sentence.replace(flag, label)
    return in_our_words(sentence.replace(f"--{data}", data))


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
        defaults = DEFAULTS["sft"]
        with FormRow():
            yield Label("epochs", classes="field-label", id="epochs-label")
            yield Field(defaults["epochs"], check=whole("epochs", 1), width=5, grow=8, id="epochs")
            yield Label("learning rate", classes="field-label -gap")
            yield Field(
                defaults["learning-rate"], check=positive("learning rate"), width=9, grow=14, id="learning-rate"
            )
            yield Label("accumulation", classes="field-label -gap")
            yield Field(
                defaults["accumulation"],
                check=whole("accumulation", 1),
                width=5,
                grow=8,
                id="accumulation",
                tooltip="forwards folded into one optimizer step",
            )
        with FormRow():
            yield from labelled("rank", Field(defaults["rank"], check=whole("rank", 1), width=5, grow=8, id="rank"))
            yield Label("alpha", classes="field-label -gap")
            yield Field(defaults["alpha"], check=positive("alpha"), width=6, grow=10, id="alpha")
            yield Label("targets", classes="field-label -gap")
            yield Field(
                defaults["targets"],
                check=check_targets,
                width=14,
                grow=40,
                id="targets",
                tooltip="query, key, value, output, gate, up, down (or q_proj …), comma separated",
            )
            yield Label("beta", classes="field-label -gap beta-only")
            yield Field(defaults["beta"], check=not_negative("beta"), width=6, grow=10, id="beta", classes="beta-only")
        with FormRow(classes="grpo-only"):
            yield from labelled(
                "group",
                Field(
                    defaults["group"],
                    check=whole("group", 2),
                    width=5,
                    grow=8,
                    id="group",
                    tooltip="completions sampled per prompt",
                ),
            )
            yield Label("reward", classes="field-label -gap")
            yield Field(
                "length", id="reward", tooltip="length (tokens emitted), or a reward model written by tune reward"
            )
        with MoreSettings(title=MORE_TITLE, id="more"):
            with FormRow():
                yield from labelled(
                    "seed",
                    self._more(
                        "seed",
                        6,
                        24,
                        "the adapter's initial factors and the order of the data (grpo: its sampling too)",
                    ),
                )
                yield Label("layers", classes="field-label -gap")
                yield self._more("layers", 6, 24, "layers that carry an adapter: all, or such as 2,5 or 8-15")
                yield Label("warmup steps", classes="field-label -gap")
                yield self._more("warmup-steps", 5, 8, "optimizer steps over which the learning rate ramps up")
            with FormRow():
                yield from labelled(
                    "checkpoint every",
                    self._more(
                        "checkpoint-every",
                        5,
                        8,
                        "write a resumable checkpoint every this many steps; 0: only when cancelled",
                    ),
                )
                yield Label("max sequence", classes="field-label -gap")
                yield self._more("max-sequence", 6, 8, "tokens; a longer sequence is skipped, never cut")
                yield Label("batch", classes="field-label -gap no-grpo")
                yield self._more(
                    "batch-size", 5, 8, "units per forward (grpo decodes each prompt's group as one)", "no-grpo"
                )
            with FormRow(classes="grpo-only"):
                yield from labelled(
                    "temperature",
                    self._more("temperature", 6, 10, "sampling temperature of the completions, above zero"),
                )
                yield Label("top-p", classes="field-label -gap")
                yield self._more("top-p", 6, 10, "nucleus sampling: 1 keeps every token")
                yield Label("max new tokens", classes="field-label -gap")
                yield self._more("max-new-tokens", 5, 8, "tokens sampled per completion at most")
        yield JobProgress("t trains an adapter; ctrl+x cancels and keeps a checkpoint, r resumes it", id="progress")
        yield Wrapped("", id="message")
        yield Curves(id="curves")

    @staticmethod
    def _more(name: str, width: int, grow: int, tooltip: str, classes: str = "") -> Field:
        return Field(
            DEFAULTS["sft"][name], check=CHECKS[name], width=width, grow=grow, id=name, tooltip=tooltip, classes=classes
        )

    def on_mount(self) -> None:
        self._show_objective()

    # --- the form ------------------------------------------------------------------------------------

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "objective" or event.value == self.objective:
            return
        data = self.query_one("#data", Field)
        self._typed[DATA[self.objective]] = data.value  # each kind of data keeps what was typed for it
        before, self.objective = DEFAULTS[self.objective], str(event.value)
        data.value = self._typed.get(DATA[self.objective], "")
        for name, value in DEFAULTS[self.objective].items():
            field = self.query_one(f"#{name}", Field)
            if field.value.strip() == before[name]:  # a default follows the objective; a typed value stays
                field.value = value
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
            if self.query_one(f"#{name}", Field).value.strip() != DEFAULTS[self.objective][name]
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
        objective, settings = self.objective, self.app.settings
        shown_ids = [name for name in NUMBER_FIELDS if name != "group" or objective == "grpo"]
        shown_ids = [name for name in shown_ids if name != "beta" or objective in ("dpo", "ipo", "grpo")]
        more = self._shown_more()
        if self.first_bad(*shown_ids, "targets"):
            return None
        if self.first_bad(*more):
            self.query_one(MoreSettings).collapsed = False  # the bad field in sight
            return None
        value = {name: self.query_one(f"#{name}", Field).value.strip() for name in (*NUMBER_FIELDS, "targets")}
        fields: dict[str, Any] = {
            "output": self.output(),
            "learning_rate": float(value["learning-rate"]),
            "accumulation": int(value["accumulation"]),
            "rank": int(value["rank"]),
            "alpha": float(value["alpha"]),
            "targets": value["targets"],
            **settings.model_fields(),
        }
        fields["iterations" if objective == "grpo" else "epochs"] = int(value["epochs"])
        for name in more:
            typed = self.query_one(f"#{name}", Field).value.strip()
            fields[name.replace("-", "_")] = typed if name == "layers" else CHECKS[name](typed)
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
        if objective in ("dpo", "ipo", "grpo"):
            fields["beta"] = float(value["beta"])
        if objective in ("dpo", "ipo"):
            fields["loss"] = objective
        if objective == "grpo":
            fields["group"] = int(value["group"])
            fields["reward"] = self.query_one("#reward", Field).value.strip()
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
                    self.add(self.engine_words(event.message), "yellow")
        elif event.type == "warning":
            self.add(f"warning: {self.engine_words(event.message)}", "yellow")
        elif event.type == "log" and event.data and "checkpoint" in event.data:  # resumed, or started over
            self.add(self.engine_words(event.message), "dim")

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
            self.say(self.engine_words(final.message), "red")

    def engine_words(self, sentence: str) -> str:
        """An engine sentence as this tab says it (the app refuses a bad request in these words too)."""
        return tune_words(sentence, DATA[self.objective])

    def _cancelled(self, sentence: str, details: dict[str, Any] | None) -> str:
        """A cancelled run in this tab's words: where it stopped and how to go on, from the error's facts."""
        if not details or "checkpoint" not in details:
            return self.engine_words(sentence)
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
