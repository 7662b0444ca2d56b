"""A per-layer plot of accuracy and a second measure (margin, or optimize's separation), drawn as text bars
so it reads the same everywhere; the bars take the width the plot is given, up to ``BAR`` cells."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

BAR = 12


def bar(fraction: float, style: str, cells: int = BAR) -> Text:
    """A bar of ``cells`` cells, ``fraction`` of it filled (a negative fraction is drawn in red)."""
    filled = round(min(abs(fraction), 1.0) * cells)
    return Text("█" * filled + "·" * (cells - filled), style="red" if fraction < 0 else style)


class LayerPlot(Static):
    """Rows of (layer, accuracy, measure): accuracy on a 0..1 scale, the measure scaled to the largest |value|."""

    DEFAULT_CSS = "LayerPlot { height: auto; padding: 0 1; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.drawn: tuple[str, list[tuple[int, float, float]], int | None, str] | None = None

    def plot(self, title: str, rows: list[tuple[int, float, float]], marked: int | None = None,
             measure: str = "margin") -> None:
        """Draw ``rows``; ``measure`` names the third number (a margin is signed, a separation is not)."""
        self.drawn = (title, rows, marked, measure)
        self._draw()

    def on_resize(self) -> None:
        if self.drawn is not None:
            self._draw()

    def _draw(self) -> None:
        assert self.drawn is not None
        title, rows, marked, measure = self.drawn
        fixed = len("layer") + len("accuracy") + max(len(measure), 7) + 2 * 5  # the number columns and padding
        cells = max(3, min(BAR, (self.size.width - fixed) // 2)) if self.size.width else BAR
        table = Table(title=title, title_justify="left", box=None, expand=False, padding=(0, 1))
        for name in ("layer", "accuracy", "", measure, ""):
            table.add_column(name, justify="right" if name else "left", no_wrap=True)
        largest = max((abs(value) for _, _, value in rows), default=0.0) or 1.0
        spec = "+.3f" if measure == "margin" else ".3f"
        for layer, accuracy, value in rows:
            label = Text(f"{layer}{' ✓' if layer == marked else ''}", style="bold green" if layer == marked else "")
            table.add_row(label, f"{accuracy:.2f}", bar(accuracy, "cyan", cells), format(value, spec),
                          bar(value / largest, "yellow", cells))
        self.update(table)
