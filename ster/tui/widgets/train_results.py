"""The Train pane's results: what the last finished job did, as a title, a table and a per-layer plot.

Each job that ends with a result replaces all three, so the table never shows one job's
rows under another's title: after ``o`` it holds the ranked candidates (sortable, the
selected row highlighted), with the holdout separation that decided the ranking beside
the margin, and the plot each layer's best candidate; after ``t`` the layers just fitted;
after ``e`` the scores on the evaluation set; after ``l`` the loaded artifact's layers. While a newer job runs,
or after it was refused or cancelled, or once the model or pair set changed, the title
says the rows are an older result and of what.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from ster.tui.paths import shown
from ster.tui.settings import layer_words
from ster.tui.widgets.calibration_view import CalibrationView
from ster.tui.widgets.layer_plot import LayerPlot
from ster.tui.widgets.wrapped import Wrapped

SORTS = ("search order", "rank", "separation", "holdout margin", "layer")
"""The candidate table's orders; ``rank`` is optimize's own: holdout accuracy, then separation, then relative
margin, so the selected row comes first."""
SORT_BY_COLUMN = {
    0: SORTS.index("layer"),
    2: SORTS.index("rank"),
    3: SORTS.index("separation"),
    4: SORTS.index("holdout margin"),
}
"""A click on a candidate column's header → the order it sorts by (other headers: search order)."""


class TrainResults(Vertical):
    """Title, table and plot of one finished job; ``old`` marks them as older than the newest job."""

    DEFAULT_CSS = """
    TrainResults { height: 1fr; }
    TrainResults #results-title { height: auto; padding: 0 1; }
    TrainResults #results-title.-old { color: $text-muted; }
    TrainResults #per-layer { height: 1fr; }
    TrainResults.-calibration #per-layer { display: none; }
    TrainResults CalibrationView { display: none; }
    TrainResults.-calibration CalibrationView { display: block; }
    TrainResults DataTable { width: auto; min-width: 30; max-width: 60%; height: 1fr; margin-right: 2; }
    TrainResults #plot-box { width: 1fr; height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.candidates: list[dict[str, Any]] = []
        self.sort_index = 0
        self.title = Text("no results yet: t trains, o optimizes, e evaluates, l loads an artifact", style="dim")
        self.old = ""
        self.sort_note = ""

    def compose(self) -> ComposeResult:
        yield Wrapped(self.title, id="results-title")
        with Horizontal(id="per-layer"):
            yield DataTable(cursor_type="row", zebra_stripes=True, id="candidates")
            with Vertical(id="plot-box"):
                yield LayerPlot(id="plot")
        yield CalibrationView(id="calibration")

    # --- one method per job that fills the results ------------------------------------------------

    def optimized(self, request: Any, data: dict[str, Any]) -> None:
        self.candidates, self.sort_index = data["selection"]["candidates"], 0
        chosen = next(c for c in self.candidates if c["selected"])
        holdout = data["selection"]["holdout"]["holdout_pairs"]
        self._new_title(
            f"optimize: {len(self.candidates)} candidates ranked on a {holdout}-pair holdout; selected "
            f"{chosen['method']} at layer {chosen['layer']} (refitted on every pair)"
        )
        self._fill_candidates()
        best: dict[int, dict[str, Any]] = {}
        for row in self.candidates:  # per layer, its best candidate by the ranking rule
            if row["layer"] not in best or rank_key(row) < rank_key(best[row["layer"]]):
                best[row["layer"]] = row
        rows = [
            (layer, row["holdout_accuracy"], row.get("holdout_separation") or 0.0)
            for layer, row in sorted(best.items())
        ]
        self.query_one(LayerPlot).plot("best candidate per layer", rows, marked=chosen["layer"], measure="separation")

    def trained(self, request: Any, data: dict[str, Any]) -> None:
        layers = [entry["layer"] for entry in data["layers"]]
        self._new_title(f"train: {data['method']} at {layer_words(layers)}, fitted on the whole set")
        self._per_layer(data, ("train acc", "train margin"), ("train_accuracy", "train_margin"), data["method"])

    def evaluated(self, request: Any, data: dict[str, Any], artifact: str) -> None:
        where = shown(request.pairs) if request.pairs else "the Pairs tab's set"
        self._new_title(f"evaluate: {artifact} on {data['pair_count']} pairs of {where}")
        self._per_layer(data, ("accuracy", "margin"), ("accuracy", "margin"), data["method"])

    def loaded(self, request: Any, data: dict[str, Any]) -> None:
        self._new_title(
            f"loaded {shown(request.artifact)}: {data['trait_name']}, {data['method']}, fitted on {data['model']}"
        )
        self._per_layer(data, ("train acc", "train margin"), ("train_accuracy", "train_margin"), data["method"])

    def calibrated(self, where: Path, data: dict[str, Any], front: list[dict[str, Any]], loaded: bool) -> None:
        """A calibration's front (after ``c``, or ``l`` of a calibrated artifact): the table and plot of the
        calibration view in place of the per-layer ones."""
        record = data["calibration"]
        layers = [entry["layer"] for entry in data["layers"]]
        what = f"loaded {shown(where)}" if loaded else "calibrate"
        self._new_title(
            f"{what}: {data['method']} at {layer_words(layers)}, chosen over {len(record['trials'])} "
            f"trials within KL {record['kl_budget']:g}"
        )
        self.candidates = []
        self.add_class("-calibration")
        self.query_one("#candidates", DataTable).can_focus = False  # hidden: the tab's focus goes to the front
        self.query_one(CalibrationView).show(record, front, data["method"], layers)

    def ablation_calibrated(self, where: Path, data: dict[str, Any], front: list[dict[str, Any]]) -> None:
        """A loaded artifact calibrated with ``--mode ablate``: its ablation's front in the calibration view."""
        record = data["calibration"]
        ablation = record["ablation"]
        self._new_title(
            f"loaded {shown(where)}: an ablation of the direction at layer {ablation['direction_layer']}, chosen "
            f"over {len(ablation['trials'])} trials within KL {record['kl_budget']:g}"
        )
        self.candidates = []
        self.add_class("-calibration")
        self.query_one("#candidates", DataTable).can_focus = False
        self.query_one(CalibrationView).show_ablation(record, front)

    def unmark(self) -> None:
        """The rows are current again (a job that added to them, not replaced them, has finished)."""
        if self.old:
            self.old = ""
            self._show_title()

    def mark_old(self, why: str) -> None:
        """Keep the rows but say they are older than ``why`` (a job running, refused, or a setting changed)."""
        if self.candidates or self.query_one("#candidates", DataTable).row_count or self.has_class("-calibration"):
            self.old = why
            self._show_title()

    def sort(self, index: int | None = None) -> None:
        """Cycle the candidate order (or take ``index`` of SORTS); only optimize's table has an order to pick."""
        if self.candidates:
            self.sort_index = (self.sort_index + 1) % len(SORTS) if index is None else index
            self._fill_candidates()

    # --- drawing ---------------------------------------------------------------------------------

    def _new_title(self, text: str) -> None:
        self.remove_class("-calibration")
        self.query_one("#candidates", DataTable).can_focus = True
        self.title, self.old, self.sort_note = Text(text), "", ""
        self._show_title()

    def _show_title(self) -> None:
        label = self.query_one("#results-title", Static)
        label.set_class(bool(self.old), "-old")
        title = Text.assemble((f"older result ({self.old}): ", "yellow"), self.title) if self.old else self.title
        label.update(Text.assemble(title, (self.sort_note, "dim")))

    def _per_layer(self, data: dict[str, Any], labels: tuple[str, str], keys: tuple[str, str], method: str) -> None:
        self.candidates = []
        table = self.query_one("#candidates", DataTable)
        table.clear(columns=True)
        table.add_columns("layer", "method", *labels)
        rows = [(entry["layer"], entry[keys[0]], entry[keys[1]]) for entry in data["layers"]]
        for layer, accuracy, margin in rows:
            table.add_row(str(layer), method, f"{accuracy:.3f}", f"{margin:+.4f}")
        self.query_one(LayerPlot).plot("per layer", rows)

    def _fill_candidates(self) -> None:
        table = self.query_one("#candidates", DataTable)
        table.clear(columns=True)
        table.add_columns("layer", "method", "holdout acc", "separation", "holdout margin", "selected")
        for row in self._sorted():
            style = "bold green" if row["selected"] else ""
            separation = row.get("holdout_separation")
            table.add_row(
                *(
                    Text(cell, style=style)
                    for cell in (
                        str(row["layer"]),
                        row["method"],
                        f"{row['holdout_accuracy']:.3f}",
                        "—" if separation is None else f"{separation:.3f}",
                        f"{row['holdout_margin']:+.4f}",
                        "✓" if row["selected"] else "",
                    )
                )
            )
        self.sort_note = f" · by {SORTS[self.sort_index]} (s sorts)"
        self._show_title()

    def _sorted(self) -> list[dict[str, Any]]:
        order, rows = SORTS[self.sort_index], list(self.candidates)
        if order == "rank":
            rows.sort(key=rank_key)
        elif order == "separation":
            rows.sort(key=lambda row: -_number(row.get("holdout_separation")))
        elif order == "holdout margin":
            rows.sort(key=lambda row: -row["holdout_margin"])
        elif order == "layer":
            rows.sort(key=lambda row: row["layer"])
        return rows


def rank_key(row: dict[str, Any]) -> tuple[float, float, float]:
    """A candidate's place in optimize's ranking (smallest first): holdout accuracy, then separation (the
    margin over the holdout's spread within each side), then the margin over the activation norm."""
    return (-row["holdout_accuracy"], -_number(row.get("holdout_separation")), -_number(row.get("relative_margin")))


def _number(value: float | None) -> float:
    """A ranking number that may be missing (a one-pair holdout has no separation): missing sorts last."""
    return float("-inf") if value is None else value
