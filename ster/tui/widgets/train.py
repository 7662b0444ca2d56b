"""The Train pane: fit (train) or select (optimize) a direction, evaluate it, load an artifact.

Everything here builds a job request from the form and renders the job's events:
progress into the bar, refusals and warnings into the message line, the optimize
candidate table (sortable, the selected row highlighted) and a per-layer plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Select, Static

from ster.engine.steering.artifact import provenance_sentences
from ster.tui.messages import JobEvent, JobFinished
from ster.tui.widgets.layer_plot import LayerPlot

SORTS = ("search order", "holdout accuracy", "holdout margin", "layer")


class TrainPane(Vertical):
    """Train, optimize, evaluate, load."""

    DEFAULT_CSS = """
    TrainPane .form { height: auto; }
    TrainPane .form Input { width: 1fr; }
    TrainPane .form Select { width: 18; }
    TrainPane .form Label { padding: 1 1 0 0; }
    TrainPane #progress-row { height: 1; margin: 1 0 0 0; }
    TrainPane #progress-row Label { width: 1fr; padding: 0 1; }
    TrainPane #message { height: auto; padding: 0 1; }
    TrainPane #results { height: 1fr; }
    TrainPane #candidates { width: 1fr; }
    TrainPane #plot-scroll { width: 1fr; }
    """
    BINDINGS = [
        Binding("t", "train", "Train", tooltip="Fit one direction per selected layer"),
        Binding("o", "optimize", "Optimize", tooltip="Rank every method at every layer on a holdout"),
        Binding("e", "evaluate", "Evaluate", tooltip="Score the current artifact on a pair set"),
        Binding("l", "load", "Load artifact", tooltip="Use an artifact from disk"),
        Binding("s", "sort", "Sort table", tooltip="Cycle the candidate table's order"),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidates: list[dict[str, Any]] = []
        self.sort_index = 0

    def compose(self) -> ComposeResult:
        with Horizontal(classes="form"):
            yield Label("layers")
            yield Input("all", id="layers", tooltip="all, a comma list (2,5), or a half-open range (2..6)")
            yield Select([(m, m) for m in ("caa", "pca", "logistic")], value="caa", allow_blank=False, id="method")
            yield Label("artifact")
            yield Input("direction.ster.json", id="output")
            yield Button("Train (t)", id="train")
            yield Button("Optimize (o)", variant="primary", id="optimize")
        with Horizontal(classes="form"):
            yield Label("evaluate on")
            yield Input(placeholder="pair set (default: the Pairs tab's set)", id="eval-pairs")
            yield Button("Evaluate (e)", id="evaluate")
            yield Button("Load artifact (l)", id="load")
        with Horizontal(id="progress-row"):
            yield ProgressBar(total=None, show_eta=False, id="progress")
            yield Label("", id="stage")
        yield Static("", id="message")
        with Horizontal(id="results"):
            table = DataTable(cursor_type="row", zebra_stripes=True, id="candidates")
            table.add_columns("layer", "method", "holdout acc", "holdout margin", "selected")
            yield table
            with Vertical(id="plot-scroll"):
                yield LayerPlot(id="plot")

    # --- actions: each builds a request and starts one job ------------------------------------

    def action_train(self) -> None:
        self._run("train", method=self.query_one("#method", Select).value, **self._fit_fields())

    def action_optimize(self) -> None:
        self._run("optimize", **self._fit_fields())

    def action_evaluate(self) -> None:
        vector = self.app.settings.vector  # type: ignore[attr-defined]
        if vector is None:
            self._say("no artifact yet: train, optimize or load one first", "red")
            return
        pairs = self.query_one("#eval-pairs", Input).value.strip() or self.app.settings.pairs  # type: ignore[attr-defined]
        self._run("evaluate", pairs=pairs, vector=vector, **self._model_fields())

    def action_load(self) -> None:
        from ster.tui.screens.dialogs import AskText

        current = str(self.app.settings.vector or self.query_one("#output", Input).value)  # type: ignore[attr-defined]
        self.app.push_screen(AskText("Steering artifact to load", current), self._load)

    def _load(self, path: str | None) -> None:
        if path:
            self._run("inspect", artifact=Path(path))

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        self._fill_candidates()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        getattr(self, f"action_{event.button.id}")()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self.sort_index = {0: 3, 2: 1, 3: 2}.get(event.column_index, 0)
        self._fill_candidates()

    def _fit_fields(self) -> dict[str, Any]:
        return {"pairs": self.app.settings.pairs, "layers": self.query_one("#layers", Input).value.strip() or "all",  # type: ignore[attr-defined]
                "output": Path(self.query_one("#output", Input).value.strip() or "direction.ster.json"),
                **self._model_fields()}

    def _model_fields(self) -> dict[str, Any]:
        return self.app.settings.model_fields()  # type: ignore[attr-defined]

    def _run(self, job: str, **fields: Any) -> None:
        self._say("", "")
        self.app.start_job(job, fields, self)  # type: ignore[attr-defined]

    # --- rendering the job's events -------------------------------------------------------------

    def on_job_event(self, message: JobEvent) -> None:
        event = message.event
        if event.type == "progress":
            bar = self.query_one(ProgressBar)
            bar.update(total=event.total, progress=event.current or 0)
            self.query_one("#stage", Label).update(event.message)
        elif event.type == "warning":
            self._say(f"warning: {event.message}", "yellow")

    def on_job_finished(self, message: JobFinished) -> None:
        final = message.final
        self.query_one("#stage", Label).update("")
        self.query_one(ProgressBar).update(total=100, progress=100 if final.type == "result" else 0)
        if final.type == "error":
            self._say(final.message, "red")
            return
        data = final.data  # type: ignore[union-attr]
        handler = {"train": self._trained, "optimize": self._optimized, "evaluate": self._evaluated,
                   "inspect": self._loaded}[message.handle.name]
        handler(message.handle.request, data)

    def _trained(self, request: Any, data: dict[str, Any]) -> None:
        self.app.settings.vector = request.output  # type: ignore[attr-defined]
        rows = [(layer["layer"], layer["train_accuracy"], layer["train_margin"]) for layer in data["layers"]]
        self.query_one(LayerPlot).plot(f"train: {data['method']} on the whole set ({request.output})", rows)
        self._say(f"wrote {request.output}: {data['method']} at {len(rows)} layer(s); Generate uses it now", "green")

    def _optimized(self, request: Any, data: dict[str, Any]) -> None:
        self.app.settings.vector = request.output  # type: ignore[attr-defined]
        self.candidates = data["selection"]["candidates"]
        self._fill_candidates()
        chosen = next(c for c in self.candidates if c["selected"])
        best = {}
        for row in self.candidates:  # per layer, its best candidate by the ranking rule
            if row["layer"] not in best or (row["holdout_accuracy"], row["holdout_margin"]) > best[row["layer"]]:
                best[row["layer"]] = (row["holdout_accuracy"], row["holdout_margin"])
        rows = [(layer, acc, margin) for layer, (acc, margin) in sorted(best.items())]
        holdout = data["selection"]["holdout"]["holdout_pairs"]
        self.query_one(LayerPlot).plot(f"optimize: best holdout score per layer ({holdout}-pair holdout)", rows,
                                       marked=chosen["layer"])
        self._say(f"wrote {request.output}: {data['metadata']['selection']}; selected {chosen['method']} at layer "
                  f"{chosen['layer']}", "green")

    def _evaluated(self, request: Any, data: dict[str, Any]) -> None:
        rows = [(layer["layer"], layer["accuracy"], layer["margin"]) for layer in data["layers"]]
        where = request.pairs or "the workspace's active set"
        self.query_one(LayerPlot).plot(f"evaluate: {data['pair_count']} pairs of {where}", rows)
        self.app.settings.chat_decision = data["chat_template"]  # type: ignore[attr-defined]

    def _loaded(self, request: Any, data: dict[str, Any]) -> None:
        settings = self.app.settings  # type: ignore[attr-defined]
        settings.vector = request.artifact
        rows = [(layer["layer"], layer["train_accuracy"], layer["train_margin"]) for layer in data["layers"]]
        self.query_one(LayerPlot).plot(f"{request.artifact}: {data['trait_name']}, {data['method']}, fitted on "
                                       f"{data['model']}", rows)
        warnings = provenance_sentences(data["precision"], data["chat_template"], settings.precision,
                                        settings.chat_decision)
        if data["model"] != settings.model:
            warnings.insert(0, f'this artifact was trained for model "{data["model"]}"; the app uses '
                               f'"{settings.model}", so generate and evaluate will refuse it')
        self._say("\n".join(f"warning: {w}" for w in warnings) or f"loaded {request.artifact}",
                  "yellow" if warnings else "green")

    def _fill_candidates(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        keyed = list(enumerate(self.candidates))
        order = SORTS[self.sort_index]
        if order == "holdout accuracy":
            keyed.sort(key=lambda item: (-item[1]["holdout_accuracy"], -item[1]["holdout_margin"]))
        elif order == "holdout margin":
            keyed.sort(key=lambda item: -item[1]["holdout_margin"])
        elif order == "layer":
            keyed.sort(key=lambda item: (item[1]["layer"], item[0]))
        for _, row in keyed:
            style = "bold green" if row["selected"] else ""
            table.add_row(Text(str(row["layer"]), style=style), Text(row["method"], style=style),
                          Text(f"{row['holdout_accuracy']:.3f}", style=style),
                          Text(f"{row['holdout_margin']:+.4f}", style=style), Text("✓" if row["selected"] else "",
                                                                                   style=style))
        table.border_title = f"candidates, by {order} (s to sort)"

    def _say(self, text: str, style: str) -> None:
        self.query_one("#message", Static).update(Text(text, style=style))
