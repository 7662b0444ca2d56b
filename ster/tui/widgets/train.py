"""The Train pane: fit (train) or select (optimize) a direction, evaluate it, load an artifact.

Everything here builds a job request from the form and renders the job's events: the
progress line, refusals and warnings in the message line, and the results of the last
finished job (:mod:`ster.tui.widgets.train_results`). An artifact the person does not
name goes to the workspace's artifact directory under a name made of the trait, the
method and the model; any existing file is replaced only after the person says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Select

from ster.engine.steering.artifact import provenance_sentences
from ster.tui.messages import JobEvent, JobFinished, JobStarted, SettingsChanged
from ster.tui.paths import default_artifact, shown
from ster.tui.runner import final_state
from ster.tui.widgets.fields import Field, FieldErrors, FormRow, MessageLine, labelled
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.train_results import SORT_BY_COLUMN, TrainResults
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import in_our_words, parse_layers

METHODS = ("caa", "pca", "logistic")


class TrainPane(MessageLine, FieldErrors, Vertical):
    """Train, optimize, evaluate, load."""

    DEFAULT_CSS = """
    TrainPane Select { width: 14; }
    TrainPane #output { width: 1fr; }
    TrainPane #eval-pairs { width: 1fr; }
    TrainPane #message { height: auto; padding: 0 1; display: none; }
    """
    BINDINGS = [
        Binding("t", "train", "Train", tooltip="Fit one direction per selected layer with the chosen method"),
        Binding("o", "optimize", "Optimize", tooltip="Rank every method at every selected layer on a holdout"),
        Binding("e", "evaluate", "Evaluate", tooltip="Score the current artifact on a pair set"),
        Binding("l", "load", "Load", tooltip="Use an artifact from disk"),
        Binding("s", "sort", "Sort", tooltip="Cycle the candidate table's order"),
    ]

    def compose(self) -> ComposeResult:
        with FormRow():
            yield from labelled("layers", Field("all", check=parse_layers, width=8, grow=24, id="layers",
                                                tooltip="all, a comma list (2,5), or a half-open range (2..6)"))
            yield Label("method", classes="field-label -gap")
            yield Select([(m, m) for m in METHODS], value="caa", allow_blank=False, compact=True, id="method")
            yield Label("artifact", classes="field-label -gap")
            yield Field(id="output", tooltip="where t and o write; empty: the default named in grey")
        with FormRow():
            yield from labelled("evaluate on", Field(placeholder="the Pairs tab's saved set", id="eval-pairs"))
        yield JobProgress("t trains, o optimizes; the artifact is what the Generate tab applies", id="progress")
        yield Wrapped("", id="message")
        yield TrainResults(id="results")

    def on_mount(self) -> None:
        self._default_output()
        settings = self.app.settings  # type: ignore[attr-defined]
        if settings.vector is not None and settings.artifact is None:
            self._run("inspect", artifact=settings.vector)  # so every tab can name what it applies

    # --- actions: each builds a request and starts one job ------------------------------------

    def action_train(self) -> None:
        self._fit("train", method=self.query_one("#method", Select).value)

    def action_optimize(self) -> None:
        self._fit("optimize")

    def _fit(self, job: str, **extra: Any) -> None:
        if self.first_bad("layers"):
            return
        settings = self.app.settings  # type: ignore[attr-defined]
        output = self._output(job)
        fields = {"pairs": settings.pairs, "layers": self.query_one("#layers", Field).value.strip() or "all",
                  "output": output, **extra, **settings.model_fields()}
        from ster.tui.screens.dialogs import replace_or_keep

        replace_or_keep(self.app, output, "steering artifact", "the new artifact", lambda: self._run(job, **fields),
                        self.say)

    def _output(self, job: str) -> Path:
        typed = self.query_one("#output", Field).value.strip()
        return Path(typed).expanduser() if typed else self._default_path(job)

    def _default_path(self, job: str) -> Path:
        settings = self.app.settings  # type: ignore[attr-defined]
        method = str(self.query_one("#method", Select).value) if job == "train" else "optimized"
        return default_artifact(settings.trait, method, settings.model)

    def _default_output(self) -> None:
        self.query_one("#output", Field).placeholder = (f"{shown(self._default_path('train'))}, or "
                                                        f"{self._default_path('optimize').name} for o")

    def on_select_changed(self) -> None:
        self._default_output()

    def on_settings_changed(self, message: SettingsChanged) -> None:
        self._default_output()
        if message.changed & {"model", "pairs"}:
            what = "the model" if "model" in message.changed else "the pair set"
            self.query_one(TrainResults).mark_old(f"{what} has changed since")

    def action_evaluate(self) -> None:
        settings = self.app.settings  # type: ignore[attr-defined]
        if settings.vector is None:
            self.say("no artifact yet: train (t), optimize (o) or load (l) one first", "red")
            return
        typed = self.query_one("#eval-pairs", Field).value.strip()
        pairs = Path(typed).expanduser() if typed else settings.pairs
        self._run("evaluate", pairs=pairs, vector=settings.vector, **settings.model_fields())

    def action_load(self) -> None:
        from ster.tui.screens.dialogs import AskText

        settings = self.app.settings  # type: ignore[attr-defined]
        current = str(settings.vector or self._default_path("optimize"))
        self.app.push_screen(AskText("Steering artifact to load", current), self._load)

    def _load(self, path: str | None) -> None:
        if path:
            self._run("inspect", artifact=Path(path).expanduser())

    def action_sort(self) -> None:
        self.query_one(TrainResults).sort()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self.query_one(TrainResults).sort(SORT_BY_COLUMN.get(event.column_index, 0))

    def _run(self, job: str, **fields: Any) -> None:
        self.say("", "")
        handle = self.app.start_job(job, fields, self)  # type: ignore[attr-defined]
        if handle is not None:
            self.query_one(JobProgress).queued(handle, job)
            self.query_one(TrainResults).mark_old(f"{job} is running")

    # --- rendering the job's events -------------------------------------------------------------

    def on_job_started(self, message: JobStarted) -> None:
        self.query_one(JobProgress).started(message.handle, message.handle.name, message.first)

    def on_job_event(self, message: JobEvent) -> None:
        if message.step is not None:
            self.query_one(JobProgress).stepped(message.handle, message.step)
        if message.event.type == "warning":
            self.add(f"warning: {in_our_words(message.event.message)}", "yellow")

    def on_job_finished(self, message: JobFinished) -> None:
        handle, final = message.handle, message.final
        state = final_state(final)
        self.query_one(JobProgress).ended(handle, state, getattr(final, "message", ""))
        if final.type == "error":
            self.query_one(TrainResults).mark_old(f"the last {handle.name} was {state}")
            if final.kind != "cancelled":
                self.say(in_our_words(final.message), "red")
            return
        getattr(self, f"_{handle.name}")(handle.request, final.data)  # type: ignore[union-attr]

    def _train(self, request: Any, data: dict[str, Any]) -> None:
        self._use(request.output, data)
        self.query_one(TrainResults).trained(request, data)
        self.say(f"wrote {shown(request.output)}; the Generate tab applies it now", "green")

    def _optimize(self, request: Any, data: dict[str, Any]) -> None:
        self._use(request.output, data)
        self.query_one(TrainResults).optimized(request, data)
        self.say(f"wrote {shown(request.output)}; the Generate tab applies it now", "green")

    def _evaluate(self, request: Any, data: dict[str, Any]) -> None:
        settings = self.app.settings  # type: ignore[attr-defined]
        settings.chat_decision = data["chat_template"]
        self.query_one(TrainResults).evaluated(request, data, settings.artifact_label())
        self.app.refresh_status()  # type: ignore[attr-defined]

    def _inspect(self, request: Any, data: dict[str, Any]) -> None:
        settings = self.app.settings  # type: ignore[attr-defined]
        self._use(request.artifact, data)
        self.query_one(TrainResults).loaded(request, data)
        warnings = provenance_sentences(data["precision"], data["chat_template"], settings.precision,
                                        settings.chat_decision)
        if data["model"] != settings.model:
            warnings.insert(0, f'this artifact was trained for model "{data["model"]}" and the app uses '
                               f'"{settings.model}"; generate and evaluate refuse it unless the engine finds the '
                               "two are the same checkpoint")
        self.say("\n".join(f"warning: {w}" for w in warnings) or f"loaded {shown(request.artifact)}",
                 "yellow" if warnings else "green")

    def _use(self, path: Path, summary: dict[str, Any]) -> None:
        self.app.settings.use_artifact(path, summary)  # type: ignore[attr-defined]
        self.app.settings_changed("artifact")  # type: ignore[attr-defined]

