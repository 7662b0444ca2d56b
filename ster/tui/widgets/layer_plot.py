"""A per-layer plot of accuracy and a second measure (margin, or optimize's separation) against the layer.

Drawn with textual-plotext, the widget the Tune tab's curves use: accuracy on the left axis
(0 to 1, cyan), the measure on the right axis (yellow), a marked layer (optimize's
selection) as a green vertical line with a ✓ on its tick. The title line above names the
rows and the colours; the bottom row names the axes. Like the curves, plotext is imported
when the first rows arrive (a job's result), so the first paint never pays for it.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ster.tui.widgets.curves import ticks

Rows = list[tuple[int, float, float]]


class LayerPlot(Vertical):
    """Rows of (layer, accuracy, measure): accuracy on a 0..1 left axis, the measure on its own right axis."""

    DEFAULT_CSS = """
    LayerPlot { height: 1fr; }
    LayerPlot #layer-plot-title { height: auto; padding: 0 1; }
    LayerPlot #layer-plot { height: 1fr; min-height: 6; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drawn: tuple[str, Rows, int | None, str] | None = None
        """What the plot shows: its title, the rows, the marked layer and the measure's name."""
        self.plot_widget: Any = None
        """The textual-plotext widget, once the first rows have arrived."""

    def compose(self) -> ComposeResult:
        yield Static("", id="layer-plot-title")

    def plot(self, title: str, rows: Rows, marked: int | None = None, measure: str = "margin") -> None:
        """Draw ``rows``; ``measure`` names the third number (a margin is signed, a separation is not)."""
        self.drawn = (title, rows, marked, measure)
        self.query_one("#layer-plot-title", Static).update(self._title())
        if self.plot_widget is None:
            from textual_plotext import PlotextPlot

            self.plot_widget = PlotextPlot(id="layer-plot")
            self.mount(self.plot_widget)
        self._draw()

    def _title(self) -> Text:
        assert self.drawn is not None
        title, _, marked, measure = self.drawn
        parts: list[Any] = [f"{title}: ", ("accuracy", "cyan"), " left, ", (measure, "yellow"), " right"]
        if marked is not None:
            parts += [", ", (f"✓ layer {marked}", "bold green")]
        return Text.assemble(*parts)

    def _draw(self) -> None:
        assert self.drawn is not None and self.plot_widget is not None
        _, rows, marked, measure = self.drawn
        plt = self.plot_widget.plt
        plt.clear_figure()
        if not rows:
            self.plot_widget.refresh()
            return
        layers = [layer for layer, _, _ in rows]
        accuracy = [value for _, value, _ in rows]
        second = [value for _, _, value in rows]
        plt.xlabel("layer")
        plt.ylabel("accuracy", yside="left")
        plt.ylabel(measure, yside="right")
        if marked is not None:
            plt.vline(marked, "green")  # first, so the curves are drawn over it
        marker = "braille" if len(rows) > 1 else "●"  # a lone layer is a point, not a line
        plt.plot(layers, accuracy, marker=marker, color="cyan")
        plt.ylim(0, 1, yside="left")
        plt.yticks([0, 0.25, 0.5, 0.75, 1], ["0", "0.25", "0.5", "0.75", "1"], yside="left")
        plt.plot(layers, second, marker=marker, color="yellow", yside="right")
        plt.yticks(*ticks(second), yside="right")
        low, high = min(layers), max(layers)
        plt.xlim(low - 0.5, high + 0.5) if low == high else plt.xlim(low, high)
        plt.xticks(*layer_ticks(layers, marked))
        self.plot_widget.refresh()


def layer_ticks(layers: list[int], marked: int | None, most: int = 9) -> tuple[list[int], list[str]]:
    """Ticks on the layer axis: every layer when few, else an even spread that keeps the ends and the mark."""
    if len(layers) > most:
        step = -(-(len(layers) - 1) // (most - 1))
        shown = sorted({*layers[::step], layers[-1], *([marked] if marked in layers else [])})
    else:
        shown = list(layers)
    return shown, [f"{layer} ✓" if layer == marked else str(layer) for layer in shown]
