"""A training run's curves: loss against step, a second per-step value on the right axis, the values now.

The points come from the ``train`` progress events of a tune job, whose ``data`` carries
``epoch``, ``loss``, ``learning_rate`` and ``tokens_per_second`` for every objective,
``accuracy`` and ``reward_margin`` for dpo (``score_margin`` for reward), and ``reward``,
``kl``, ``reward_spread``, ``policy_loss`` and ``completion_tokens`` for grpo. Every
numeric series is kept (``points``), one of them is drawn beside the loss (``c`` cycles
which), and the latest of each is listed with the tokens per second. The plot is
textual-plotext's, imported when the first point arrives, so opening the app costs nothing
for it. The bottom row names the axes (loss left, the second value right) instead of a
legend, which would cover the top-left corner where a loss starts and an accuracy of 1.0 runs.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

NAMES = {
    "loss": "loss",
    "accuracy": "accuracy",
    "reward_margin": "reward margin",
    "score_margin": "score margin",
    "reward": "mean reward",
    "kl": "KL",
    "learning_rate": "learn rate",
    "reward_spread": "reward spread",
    "policy_loss": "policy loss",
    "completion_tokens": "completion tok",
}
"""The per-step values the curves keep, as the list beside the plot names them, in the order it lists them."""
SECOND = {"sft": "learning_rate", "dpo": "accuracy", "ipo": "accuracy", "reward": "accuracy", "grpo": "reward"}
"""The value drawn beside the loss when a run of each objective starts."""
HINT = "loss against step appears here as the run trains"
REDRAW = 0.25
"""Seconds between redraws while steps arrive; drawing is main-thread Python the training thread waits on."""


class Curves(Horizontal, can_focus=True):
    """Loss (left axis) and one more per-step value (right axis) against the optimizer step."""

    DEFAULT_CSS = """
    Curves { height: 1fr; min-height: 5; }
    Curves #plot-area { width: 1fr; height: 1fr; }
    Curves #hint { color: $text-muted; padding: 1 1; }
    Curves #values { width: 25; height: auto; padding: 0 1; }
    Curves:focus #values { background: $boost; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.points: dict[str, list[tuple[int, float]]] = {}
        """Every numeric per-step value of the run, as (step, value)."""
        self.second: str | None = None
        self.objective = "sft"
        self.total: int | None = None
        self.epoch: int | None = None
        self.speed: float | None = None
        self._pending = False
        self.plot: Any = None
        """The textual-plotext widget, once the first point has arrived."""

    def compose(self) -> ComposeResult:
        with Vertical(id="plot-area"):
            yield Static(HINT, id="hint")
        yield Static("", id="values")

    def begin(self, objective: str, keep: bool = False) -> None:
        """A run starts; ``keep`` carries on the curve of the run it resumes."""
        self.objective = objective
        if not keep:
            self.points, self.total, self.epoch, self.speed = {}, None, None, None
        self.second = self.second if keep and self.second else SECOND.get(objective)
        self._draw()

    def add(self, step: int, total: int | None, data: dict[str, Any]) -> None:
        """One optimizer step's values (a resumed run's first step follows the checkpoint's last)."""
        self.total = total
        self.epoch = data.get("epoch", self.epoch)
        self.speed = data.get("tokens_per_second", self.speed)
        for key, value in data.items():
            if key in NAMES and isinstance(value, (int, float)):
                series = self.points.setdefault(key, [])
                while series and series[-1][0] >= step:  # a step again (a resume from an earlier checkpoint)
                    series.pop()
                series.append((step, float(value)))
        if self.plot is None:  # the first point replaces the hint with the plot at once
            self._draw()
        elif not self._pending:  # steps can come faster than a plot is worth drawing: draw a few times a second
            self._pending = True
            self.set_timer(REDRAW, self.flush)

    def flush(self) -> None:
        """Draw what has arrived now (the pane calls it when the run ends, so the last step is drawn)."""
        self._pending = False
        self._draw()

    def cycle(self) -> str | None:
        """Draw the next per-step value beside the loss; returns its name (None when there is no other)."""
        others = [key for key in NAMES if key != "loss" and key in self.points]
        if not others:
            return None
        at = others.index(self.second) if self.second in others else -1
        self.second = others[(at + 1) % len(others)]
        self._draw()
        return NAMES[self.second]

    def _draw(self) -> None:
        self.query_one("#values", Static).update(self._values())
        loss = self.points.get("loss", [])
        if not loss:
            if self.plot is not None:
                self.plot.display = False
            self.query_one("#hint").display = True
            return
        if self.plot is None:
            from textual_plotext import PlotextPlot

            self.plot = PlotextPlot(id="plot")
            self.query_one("#plot-area").mount(self.plot)
        self.plot.display, self.query_one("#hint").display = True, False
        plt = self.plot.plt
        plt.clear_figure()
        # the axes are named on the bottom row, beside "step", rather than by a legend drawn over the plot's
        # top-left corner: that is where a loss starts and where an accuracy of 1.0 runs
        plt.xlabel("step")
        plt.ylabel("loss", yside="left")
        plt.plot([s for s, _ in loss], [v for _, v in loss], marker="braille", color="cyan")
        plt.yticks(*ticks([v for _, v in loss]), yside="left")
        second = self.points.get(self.second or "", [])
        if second:
            plt.ylabel(NAMES[self.second or ""], yside="right")
            plt.plot([s for s, _ in second], [v for _, v in second], marker="braille", color="yellow", yside="right")
            plt.yticks(*ticks([v for _, v in second]), yside="right")
        first, last = loss[0][0], max(loss[-1][0], loss[0][0] + 1)  # the steps so far; the bar shows what is left
        plt.xlim(first, last)
        plt.xticks(sorted({first + round(i * (last - first) / 4) for i in range(5)}))
        self.plot.refresh()

    def _values(self) -> Table | Text:
        loss = self.points.get("loss", [])
        if not loss:
            return Text("")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(justify="right", no_wrap=True)
        step = loss[-1][0]
        grid.add_row("step", f"{step}/{self.total}" if self.total else str(step))
        if self.epoch is not None:
            grid.add_row("iteration" if self.objective == "grpo" else "epoch", str(self.epoch))
        grid.add_row(Text("loss", style="cyan"), f"{loss[-1][1]:.4f}")
        grid.add_row("first loss", f"{loss[0][1]:.4f}")
        for key in NAMES:
            if key != "loss" and key in self.points:
                label = Text(NAMES[key], style="yellow" if key == self.second else "dim")
                value = self.points[key][-1][1]
                grid.add_row(label, f"{value:.3f}" if key == "accuracy" else number(value))
        if self.speed is not None:
            grid.add_row("tokens/s", f"{self.speed:,.0f}")
        return grid


def number(value: float) -> str:
    """A value for the list: a small rate in exponent form, anything else to four places."""
    return f"{value:.2e}" if value and abs(value) < 1e-2 else f"{value:.4f}"


def ticks(values: list[float], count: int = 5) -> tuple[list[float], list[str]]:
    """``count`` ticks over the values' range, labelled with as few digits as tell them apart."""
    low, high = min(values), max(values)
    if high == low:
        low, high = low - (abs(low) or 1) * 0.01, high + (abs(high) or 1) * 0.01
    places = [low + (high - low) * i / (count - 1) for i in range(count)]
    for digits in range(2, 8):
        labels = [f"{v:.{digits}g}" for v in places]
        if len(set(labels)) == count:
            break
    return places, labels
