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
from ster.tui.runner import JobHandle, final_state
from ster.tui.widgets.calibration_view import CalibrationView, FrontRow
from ster.tui.widgets.fields import Field, FieldErrors, FormRow, MessageLine, labelled
from ster.tui.widgets.progress import JobProgress
from ster.tui.widgets.train_results import SORT_BY_COLUMN, TrainResults
from ster.tui.widgets.wrapped import Wrapped
from ster.tui.words import in_our_words, parse_layers, said

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
        Binding("e", "evaluate", "Eval", tooltip="Evaluate: score the current artifact on a pair set"),
        Binding(
            "c",
            "calibrate",
            "Calibrate",
            tooltip="Search layer, method and strength per sign for the most behaviour within a KL budget",
        ),
        Binding("l", "load", "Load", tooltip="Use an artifact from disk"),
        Binding("s", "sort", "Sort", show=False, tooltip="Cycle the candidate table's order (the title says s sorts)"),
    ]

    def compose(self) -> ComposeResult:
        with FormRow():
            yield from labelled(
                "layers",
                Field(
                    "all",
                    check=parse_layers,
                    width=8,
                    grow=24,
                    id="layers",
                    tooltip="all, a comma list (2,5), or a half-open range (2..6)",
                ),
            )
            yield Label("method", classes="field-label -gap")
            yield Select([(m, m) for m in METHODS], value="caa", allow_blank=False, compact=True, id="method")
            yield Label("artifact", classes="field-label -gap")
            yield Field(id="output", tooltip="where t and o write; empty: the default named in grey")
        with FormRow():
            yield from labelled("evaluate on", Field(placeholder="the Pairs tab's saved set", id="eval-pairs"))
        yield JobProgress("t trains, o optimizes, c calibrates: the Generate tab applies the artifact", id="progress")
        yield Wrapped("", id="message")
        yield TrainResults(id="results")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calibrated: tuple[Path, dict[str, Any]] | None = None
        """The calibrated artifact the calibration view shows, and the engine's summary of it."""
        self.adopting: tuple[Any, FrontRow] | None = None
        """The train job fitting another candidate of the front, and the row to adopt once it has."""

    def on_mount(self) -> None:
        self._default_output()
        settings = self.app.settings
        if settings.vector is not None and settings.artifact is None:
            self._run("inspect", artifact=settings.vector)  # so every tab can name what it applies

    # --- actions: each builds a request and starts one job ------------------------------------

    def action_train(self) -> None:
        self._fit("train", method=self.query_one("#method", Select).value)

    def action_optimize(self) -> None:
        self._fit("optimize")

    def action_calibrate(self) -> None:
        """The calibrate job on the app's model and pair set (the last 20% held out), within the engine's default
        KL budget; a study an interrupted run left beside the artifact is resumed."""
        if self.first_bad("layers"):
            return
        from ster.tui.screens.dialogs import replace_or_keep

        settings = self.app.settings
        output = self._output("calibrate")
        resume = _study(output).exists()
        fields = {
            "pairs": settings.pairs,
            "layers": self.query_one("#layers", Field).value.strip() or "all",
            "output": output,
            "resume": resume,
            **settings.model_fields(),
        }
        if resume:
            self._run("calibrate", **fields)
            self.add(f"resuming the study an interrupted run left at {shown(_study(output))}", "yellow")
            return
        replace_or_keep(
            self.app,
            output,
            "steering artifact",
            "the new artifact",
            lambda: self._run("calibrate", **fields),
            self.say,
        )

    def _fit(self, job: str, **extra: Any) -> None:
        if self.first_bad("layers"):
            return
        settings = self.app.settings
        output = self._output(job)
        fields = {
            "pairs": settings.pairs,
            "layers": self.query_one("#layers", Field).value.strip() or "all",
            "output": output,
            **extra,
            **settings.model_fields(),
        }
        from ster.tui.screens.dialogs import replace_or_keep

        replace_or_keep(
            self.app, output, "steering artifact", "the new artifact", lambda: self._run(job, **fields), self.say
        )

    def _output(self, job: str) -> Path:
        typed = self.query_one("#output", Field).value.strip()
        return Path(typed).expanduser() if typed else self._default_path(job)

    def _default_path(self, job: str) -> Path:
        settings = self.app.settings
        method = (
            str(self.query_one("#method", Select).value)
            if job == "train"
            else {"calibrate": "calibrated"}.get(job, "optimized")
        )
        return default_artifact(settings.trait, method, settings.model)

    def _default_output(self) -> None:
        self.query_one("#output", Field).placeholder = (
            f"{shown(self._default_path('train'))}, or "
            f"{self._default_path('optimize').name} for o, "
            f"{self._default_path('calibrate').name} for c"
        )

    def on_select_changed(self) -> None:
        self._default_output()

    def on_settings_changed(self, message: SettingsChanged) -> None:
        self._default_output()
        if message.changed & {"model", "pairs"}:
            what = "the model" if "model" in message.changed else "the pair set"
            self.query_one(TrainResults).mark_old(f"{what} has changed since")

    def action_evaluate(self) -> None:
        settings = self.app.settings
        if settings.vector is None:
            self.say("no artifact yet: train (t), optimize (o) or load (l) one first", "red")
            return
        typed = self.query_one("#eval-pairs", Field).value.strip()
        pairs = Path(typed).expanduser() if typed else settings.pairs
        self._run("evaluate", pairs=pairs, vector=settings.vector, **settings.model_fields())

    def action_load(self) -> None:
        from ster.tui.screens.dialogs import AskText

        settings = self.app.settings
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
        handle = self.app.start_job(job, fields, self)
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
        if self.adopting is not None and self.adopting[0] is handle:
            self._adopted_train(final)
            return
        if final.type == "error":
            self.query_one(TrainResults).mark_old(f"the last {handle.name} was {state}")
            if final.kind != "cancelled":
                self.say(said(final), "red")
            elif handle.name == "calibrate" and _study(output := _calibrated(handle)).exists():
                self.say(
                    f"cancelled; the study at {shown(_study(output))} keeps the finished trials, and c continues it",
                    "magenta",
                )
            return
        getattr(self, f"_{handle.name}")(handle.request, final.data)

    def _train(self, request: Any, data: dict[str, Any]) -> None:
        self._use(request.output, data)
        self.query_one(TrainResults).trained(request, data)
        self.say(f"wrote {shown(request.output)}; the Generate tab applies it now", "green")

    def _optimize(self, request: Any, data: dict[str, Any]) -> None:
        self._use(request.output, data)
        self.query_one(TrainResults).optimized(request, data)
        self.say(f"wrote {shown(request.output)}; the Generate tab applies it now", "green")

    def _calibrate(self, request: Any, data: dict[str, Any]) -> None:
        self._use(request.output, data)
        self._show_calibration(request.output, data, data["front"], loaded=False)
        settings = self.app.settings
        at = settings.calibrated()
        steers = f"Generate steers at its calibrated {at}" if at else "no + strength moved behaviour within the budget"
        self.say(f"wrote {shown(request.output)}; {steers}", "green")

    def _show_calibration(self, path: Path, data: dict[str, Any], front: list[dict[str, Any]], loaded: bool) -> None:
        self.calibrated = (path, data)
        self.query_one(TrainResults).calibrated(path, data, front, loaded)
        self.query_one(CalibrationView).query_one(DataTable).focus()

    def on_calibration_view_adopt(self, message: CalibrationView.Adopt) -> None:
        """Steer the Generate tab at a front point: the calibrated artifact itself when the row is its own
        candidate, else a direction of the row's method and layers fitted by ``train`` (whose relative strength is
        in the same unit, each layer's activation spread), adopted once it is written."""
        row, settings = message.row, self.app.settings
        if self.calibrated is None:
            return
        path, data = self.calibrated
        own = [entry["layer"] for entry in data["layers"]] == list(row.layers) and data["method"] == row.method
        if own:
            if settings.vector != path:
                self._use(path, data)
            self._adopt(path, row)
            return
        if self.adopting is not None:
            self.say("still fitting the last point's direction: wait for it, or cancel it with ctrl+x", "yellow")
            return
        layers = ",".join(map(str, row.layers))
        output = default_artifact(settings.trait, f"{row.method}-{_span(row.layers)}", settings.model)
        fields = {
            "pairs": settings.pairs,
            "layers": layers,
            "method": row.method,
            "output": output,
            **settings.model_fields(),
        }
        from ster.tui.screens.dialogs import replace_or_keep

        def fit() -> None:
            handle = self.app.start_job("train", fields, self)
            if handle is not None:
                self.adopting = (handle, row)
                self.query_one(JobProgress).queued(handle, "train")
                self.say(f"fitting {row.candidate()} to adopt it at {row.shown_strength()}…", "")

        replace_or_keep(self.app, output, "steering artifact", "the new artifact", fit, self.say)

    def on_calibration_view_adopt_ablation(self, message: CalibrationView.AdoptAblation) -> None:
        """The chosen ablation: Generate ablates with the calibrated artifact as it was calibrated. Another point
        of the front is not in the artifact's record, so its flags are said, for ``ster generate`` to take."""
        if self.calibrated is None:
            return
        path, data = self.calibrated
        row = message.row
        if not row.chosen:
            self.say(
                f"only the chosen ablation is the artifact's; this one runs as ster generate --vector {shown(path)} "
                f"{row.flags()}",
                "yellow",
            )
            return
        if self.app.settings.vector != path:
            self._use(path, data)
        generate = self.app.mounted("generate")
        if generate is not None:  # else it takes the mode from the artifact when first shown
            generate.set_mode("ablate")
        self.say(f"adopted: Generate ablates as {path.name} was calibrated ({row.refused:.0%} refused)", "green")

    def _adopted_train(self, final: Any) -> None:
        assert self.adopting is not None
        (handle, row), self.adopting = self.adopting, None
        if final.type == "error":
            if final.kind != "cancelled":
                self.say(said(final), "red")
            else:
                self.say(f"cancelled: {row.candidate()} was not fitted, nothing adopted", "magenta")
            return
        self._use(handle.request.output, final.data)
        self._adopt(handle.request.output, row)
        if final.data.get("strength_unit") != "spread":  # an engine that writes norm-unit artifacts from train
            self.add(
                f"warning: {handle.request.output.name} measures a relative strength against each layer's "
                f"activation norm, not its spread, so {row.shown_strength()} is a larger push than the "
                "front's point",
                "yellow",
            )

    def _adopt(self, path: Path, row: FrontRow) -> None:
        settings = self.app.settings
        settings.strength = row.strength_text()
        self.app.settings_changed("strength")
        which = ", the calibrated strength" if row.chosen else ""
        self.say(f"adopted: Generate steers at {row.shown_strength()}{which}, {row.candidate()} ({path.name})", "green")

    def _evaluate(self, request: Any, data: dict[str, Any]) -> None:
        settings = self.app.settings
        settings.chat_decision = data["chat_template"]
        self.query_one(TrainResults).evaluated(request, data, settings.artifact_label())
        self.app.refresh_status()

    def _inspect(self, request: Any, data: dict[str, Any]) -> None:
        settings = self.app.settings
        self._use(request.artifact, data)
        if (data.get("calibration") or {}).get("ablation"):
            from ster.engine.steering.calibration_record import Ablation, ablation_front

            trials = Ablation.model_validate(data["calibration"]["ablation"]).trials
            self.calibrated = (request.artifact, data)
            self.query_one(TrainResults).ablation_calibrated(
                request.artifact, data, [point.model_dump() for point in ablation_front(trials)]
            )
            self.query_one(CalibrationView).query_one(DataTable).focus()
        elif data.get("calibration"):
            from ster.engine.steering.calibrate import pareto
            from ster.engine.steering.calibration_record import Calibration

            front = [point.model_dump() for point in pareto(Calibration.model_validate(data["calibration"]).trials)]
            self._show_calibration(request.artifact, data, front, loaded=True)
        else:
            self.query_one(TrainResults).loaded(request, data)
        warnings = provenance_sentences(
            data["precision"], data["chat_template"], settings.precision, settings.chat_decision
        )
        if data["model"] != settings.model:
            warnings.insert(
                0,
                f'this artifact was trained for model "{data["model"]}" and the app uses '
                f'"{settings.model}"; generate and evaluate refuse it unless the engine finds the '
                "two are the same checkpoint",
            )
        at = settings.calibrated()
        loaded = f"loaded {shown(request.artifact)}" + (f"; Generate steers at its calibrated {at}" if at else "")
        self.say("\n".join(f"warning: {w}" for w in warnings) or loaded, "yellow" if warnings else "green")

    def _use(self, path: Path, summary: dict[str, Any]) -> None:
        self.app.settings.use_artifact(path, summary)
        self.app.settings_changed("artifact")


def _span(layers: tuple[int, ...]) -> str:
    """A candidate's layers in a file name: ``l2``, ``l2-3``."""
    return f"l{layers[0]}" if len(layers) == 1 else f"l{layers[0]}-{layers[-1]}"


def _calibrated(handle: JobHandle) -> Path:
    """Where a calibrate job writes its artifact."""
    from ster.engine.steering.requests import CalibrateRequest

    return handle.requested(CalibrateRequest).output


def _study(output: Path) -> Path:
    """Where an interrupted calibrate run keeps its finished trials (the engine's own rule)."""
    from ster.engine.steering.study import study_path

    return study_path(output)
