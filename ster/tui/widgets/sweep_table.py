"""The Generate pane's sweep table: one row per strength, its outputs streaming in, its measures at the end.

A sweep generates every prompt at every strength. A row is one strength: while the sweep
runs, each prompt's text streams into the row's output cell (joined with `` | ``); when it
ends, the row shows the push in the other unit, the effect with the band of its noise
and whether it lies beyond that band, and — on a wide screen — how many texts changed
and the degeneracy measures. The row's dialog (enter) has every number and the outputs whole.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ster.tui.widgets.generate_parts import NOUNS, cell, mean, one_line, shown_value

SWEEP_COLUMNS = (
    ("strength", 8),
    ("other", 8),
    ("effect", 15),
    ("KL", 5),
    ("changed", 7),
    ("dist-2", 6),
    ("run", 3),
    ("tokens", 6),
    ("judged", 10),
)
"""The sweep table's short columns and widths; "other" is the strength in the other unit (steering's; an ablation
or a clamp pushes nothing), KL the mean KL from the unsteered model on the neutral prompts (over budget in yellow);
the output takes the rest."""
NARROW_COLUMNS = ("strength", "other", "effect", "KL", "judged")
"""The short columns kept below 100 cells, so the output stays readable (the row's dialog has every measure)."""
OUTPUT = "output (enter: all of it)"
TOWARD, AGAINST = "✓", "↺"
"""The marks after an effect beyond its noise: toward the side pushed, or against it."""


def number(value: float, digits: int, sign: bool = False) -> str:
    """A measure in ``digits`` significant figures, without an exponent for a large one (1234, not 1.23e+03)."""
    plus = "+" if sign else ""
    text = f"{value:{plus}.{digits}g}"
    return f"{value:{plus}.0f}" if "e+" in text else text


def verdict(row: dict[str, Any]) -> str:
    """``toward`` or ``against`` for an effect beyond its noise (on the side pushed, or the other), else ``""``."""
    if not row.get("distinguishable") or not row["effect"]:
        return ""
    return "toward" if row["effect"] * row["strength"] > 0 else "against"


def effect_cell(row: dict[str, Any]) -> Text:
    """``+0.467 ±0.25 ✓``: the effect, the band its noise spans (``threshold``, absent with one prompt), and
    a mark when the effect lies beyond that band; the baseline's is 0 by definition."""
    if row["strength"] == 0:
        return Text("0  ", justify="right")
    if row["effect"] is None:
        return Text("—  ", justify="right")
    text = number(row["effect"], 3, sign=True) if row["effect"] else "0"
    if row.get("threshold") is not None:
        text += f" ±{number(row['threshold'], 2)}"
    judged = verdict(row)
    mark = {"toward": (f" {TOWARD}", "green"), "against": (f" {AGAINST}", "yellow")}.get(judged, ("  ", ""))
    return Text.assemble(text, mark, justify="right")


def row_text(row: dict[str, Any]) -> str:
    """A result row's outputs as one text for the clipboard or a file: each under its prompt when there are several."""
    outputs = row["outputs"]
    if len(outputs) == 1:
        return outputs[0]["text"]
    return "\n\n".join(f"[prompt {i + 1}: {o['prompt']}]\n{o['text']}" for i, o in enumerate(outputs))


class SweepTable(DataTable):
    """One row per strength of a sweep, keyed by its signed label (``+0.4x``, the baseline ``+0x``)."""

    DEFAULT_CSS = "SweepTable { height: 1fr; min-height: 4; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.texts: dict[str, list[str]] = {}
        """Per row, what the token events have streamed for each prompt."""
        self.strengths: dict[str, str] = {}
        """Per row, its strength as the strength field writes it (``0.4x``)."""
        self.rows_data: dict[str, dict[str, Any]] = {}
        """Per row, the sweep result's row, once the sweep has ended."""
        self.unit = "relative"
        self.result: dict[str, Any] | None = None
        self.adapter: str | None = None
        """The adapter the sweep's texts were generated through (its name), named in the output column's header."""
        self.mode = "add"
        """What the sweep did with the direction at each strength (add, ablate, clamp): the strength column is
        named for it (strength, weight, target)."""

    def on_mount(self) -> None:
        self._columns()

    def on_resize(self) -> None:
        """The output column takes the width the others leave, so a new width lays the table out again."""
        if self.result is not None:
            self.fill(self.result)
        elif not self.texts:
            self._columns()

    def _columns(self) -> None:
        self.clear(columns=True)
        other = "absolute" if self.unit == "relative" else "relative"
        other = other if self.mode == "add" else "no push"  # an ablation or a clamp adds nothing along the direction
        shown = [(label, width) for label, width in SWEEP_COLUMNS if self.size.width >= 100 or label in NARROW_COLUMNS]
        rest = max(10, self.size.width - sum(width + 2 for _, width in shown) - 4)
        for label, width in (*shown, (OUTPUT, rest)):
            self.add_column(other if label == "other" else self._header(label, width), width=width, key=label)

    def _header(self, label: str, width: int) -> str:
        """A column's header; the strength's says what a strength is in the sweep's mode, the output's names the
        adapter the texts came through, whole where it fits."""
        if label == "strength":
            return NOUNS[self.mode]
        if label != OUTPUT or not self.adapter:
            return label
        header = f"output through {self.adapter} (enter: all)"
        return header if len(header) <= width else f"output through {self.adapter}"

    def expect(self, mode: str) -> None:
        """Before any sweep, the header names what the next one's strengths will be in the form's mode."""
        if not self.texts and mode != self.mode:
            self.mode = mode
            self._columns()

    def begin(self, strengths: list[Any], adapter: str | None = None, mode: str = "add") -> None:
        """A waiting row per strength (engine ``Strength`` objects), so the outputs can stream into place;
        ``adapter`` names the adapter the texts are generated through (None: the base model), ``mode`` what
        each strength does."""
        self.unit, self.adapter, self.mode = strengths[0].unit, adapter, mode
        self._columns()
        self.texts = {s.signed(): [] for s in strengths}
        self.strengths = {s.signed(): str(s) for s in strengths}
        self.rows_data, self.result = {}, None
        for strength in strengths:
            cells = {
                "strength": Text(shown_signed(strength, mode), justify="right"),
                "judged": "baseline" if strength.value == 0 else "",
                OUTPUT: "",
            }
            self.add_row(
                *(cells.get(str(key.value), Text("…", justify="right")) for key in self.columns), key=strength.signed()
            )

    def stream(self, label: str, delta: str) -> None:
        """A token of the text at ``label`` (``+0.4x/2``: strength, then prompt index) into its row."""
        key, _, index = label.rpartition("/")
        if key in self.texts and index.isdigit():
            texts = self.texts[key]
            texts.extend([""] * (int(index) + 1 - len(texts)))
            texts[int(index)] += delta
            self.update_cell(key, OUTPUT, one_line(self.streamed(key), self._rest()))

    def streamed(self, key: str) -> str:
        """What has streamed into one row so far, its prompts' texts joined as the output cell shows them."""
        return " | ".join(text for text in self.texts.get(key, []) if text)

    def fill(self, data: dict[str, Any]) -> None:
        """The sweep's rows, the suggested strengths in bold with a marker."""
        from ster.engine.steering.strength import Strength

        self.unit, self.result = data["strength_unit"], data
        cursor = self.cursor_row
        self._columns()
        suggested = {data["suggested"]["positive"], data["suggested"]["negative"]} - {None}
        for row in data["rows"]:
            strength = Strength(value=row["strength"], unit=data["strength_unit"])
            key = strength.signed()
            self.rows_data[key], self.strengths[key] = row, str(strength)
            cells = sweep_cells(
                row, strength, row["strength"] in suggested, self._rest(), data.get("kl_budget"), self.mode
            )
            self.add_row(*(cells[str(column.value)] for column in self.columns), key=key)
        self.move_cursor(row=min(cursor, self.row_count - 1), animate=False)

    def highlighted_key(self) -> str | None:
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)

    def _rest(self) -> int:
        return int(self.columns[ColumnKey(OUTPUT)].width)


def shown_signed(strength: Any, mode: str = "add") -> str:
    """A sweep strength as its row shows it: signed (``+0.4x``; an ablation's weight unsigned), the baseline as a
    plain 0."""
    return "0" if strength.value == 0 else shown_value(strength.value, strength.unit, mode)


def sweep_cells(
    row: dict[str, Any], strength: Any, suggested: bool, width: int, budget: float | None = None, mode: str = "add"
) -> dict[str, Text]:
    """A result row's cells by column key (the table shows the columns its width allows); a KL over ``budget``
    is in yellow. An ablation or a clamp pushes nothing, so its other unit is a dash."""
    style = "bold green" if suggested else ""
    other = mean(row["absolute_strength"]) if strength.relative else mean(row["relative_strength"])
    judged = (
        "baseline" if row["strength"] == 0 else "fluent ◀" if suggested else "fluent" if row["fluent"] else "not fluent"
    )
    prompts = len(row["outputs"])
    numbers = {
        "strength": shown_signed(strength, mode),
        "other": cell(other, ".3g"),
        "changed": "—" if row["strength"] == 0 else f"{row.get('changed', 0)}/{prompts}",
        "dist-2": cell(row["distinct_2"], ".2f"),
        "run": str(row["longest_run"]),
        "tokens": f"{row['mean_tokens']:.1f}",
    }
    kl = row.get("kl")
    over = kl is not None and budget is not None and kl > budget
    output = one_line(" | ".join(o["text"] for o in row["outputs"]), width)
    effect = effect_cell(row)
    if style:
        effect.stylize(style)
    return {
        **{key: Text(n, style=style, justify="right") for key, n in numbers.items()},
        "effect": effect,
        "KL": Text("—" if kl is None else number(kl, 2), style=style or ("yellow" if over else ""), justify="right"),
        "judged": Text(judged, style=style or ("red" if not row["fluent"] else "")),
        OUTPUT: Text(output, style=style),
    }
