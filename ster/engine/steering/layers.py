"""The ``--layers`` selector: ``all``, or a comma list of layers and half-open ranges.

Each item of the list is one layer (``5``) or a half-open range ``a..b`` (``4..7`` is
4, 5 and 6), so ``1,4..7`` selects 1, 4, 5 and 6, as the original reads it. Parsing
checks the syntax alone, so a typo is refused before anything loads; the layer count
comes from config.json, so an out-of-range layer is refused before a weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import flag

_SHAPE = "takes all, a comma list such as 2,5, or a half-open range such as 2..6, or a mix such as 1,4..7"


@dataclass(frozen=True)
class LayerSpec:
    """A parsed selector; :meth:`resolve` turns it into sorted layer indices."""

    text: str
    items: tuple[range, ...] | None
    """The items in the order written, each a range (one layer is a range of one), or None for ``all``.
    Ranges stay unexpanded until :meth:`resolve` has checked them against the model, so
    ``0..99999999999`` is refused as out of range rather than built."""

    @classmethod
    def parse(cls, text: str) -> LayerSpec:
        """Parse the selector's syntax; refuse anything that is not ``all`` or a list of layers and ranges."""
        spec = text.strip()
        if spec == "all":
            return cls(spec, None)
        return cls(spec, tuple(_item(item.strip(), text) for item in spec.split(",")))

    def resolve(self, num_layers: int) -> list[int]:
        """Sorted, de-duplicated indices, refusing any layer the model does not have."""
        if self.items is None:
            return list(range(num_layers))
        for item in self.items:
            if item[-1] >= num_layers:
                first = max(item.start, num_layers)
                raise Refusal(
                    f"layer {first} is out of range: this model has {num_layers} layers, numbered 0..{num_layers - 1}"
                )
        return sorted({index for item in self.items for index in item})


def _item(item: str, text: str) -> range:
    """One item of the list: a layer, or a non-empty half-open range of layers."""
    try:
        if ".." not in item:
            layer = _layer(item)
            return range(layer, layer + 1)
        start_text, end_text = item.split("..", 1)
        start, end = _layer(start_text), _layer(end_text)
    except ValueError:
        raise Refusal(f'{flag("layers")} {_SHAPE}; got "{text}"') from None
    if end <= start:
        raise Refusal(f"layer range {item} is empty: a..b selects a up to but not including b")
    return range(start, end)


def _layer(text: str) -> int:
    """A layer number: digits only, so a sign, a space or an underscore is refused."""
    if not text.isdigit() or not text.isascii():
        raise ValueError(text)
    return int(text)
