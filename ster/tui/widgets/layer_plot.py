"""A per-layer plot of accuracy and margin, drawn as text bars so it reads the same everywhere."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

BAR = 12


def bar(fraction: float, style: str) -> Text:
    """A bar of BAR cells, ``fraction`` of it filled (a negative fraction is drawn in red)."""
    cells = round(min(abs(fraction), 1.0) * BAR)
    return Text("█" * cells + "·" * (BAR - cells), style="red" if fraction < 0 else style)


class LayerPlot(Static):
    """Rows of (layer, accuracy, margin): accuracy on a 0..1 scale, margin scaled to the largest |margin|."""

    DEFAULT_CSS = "LayerPlot { height: auto; padding: 0 1; }"

    def plot(self, title: str, rows: list[tuple[int, float, float]], marked: int | None = None) -> None:
        table = Table(title=title, title_justify="left", box=None, expand=False, padding=(0, 1))
        for name in ("layer", "accuracy", "", "margin", ""):
            table.add_column(name, justify="right" if name in ("layer", "accuracy", "margin") else "left")
        largest = max((abs(margin) for _, _, margin in rows), default=0.0) or 1.0
        for layer, accuracy, margin in rows:
            label = Text(f"{layer}{' ✓' if layer == marked else ''}", style="bold green" if layer == marked else "")
            table.add_row(label, f"{accuracy:.2f}", bar(accuracy, "cyan"), f"{margin:+.3f}",
                          bar(margin / largest, "yellow"))
        self.update(table)
