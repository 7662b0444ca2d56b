"""The ``--layers`` selector: ``all``, a comma list such as ``2,5``, or a half-open range ``a..b``.

Parsing checks the syntax alone, so a typo is refused before anything loads; the
layer count comes from config.json, so an out-of-range layer is refused before a
weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ster.engine.protocol.errors import Refusal

_SHAPE = "--layers takes all, a comma list such as 2,5, or a half-open range such as 2..6"


@dataclass(frozen=True)
class LayerSpec:
    """A parsed selector; :meth:`resolve` turns it into sorted layer indices."""

    text: str
    indices: tuple[int, ...] | None
    """Explicit indices, or None for ``all``."""

    @classmethod
    def parse(cls, text: str) -> LayerSpec:
        """Parse the selector's syntax; refuse anything that is not one of the three forms."""
        spec = text.strip()
        if spec == "all":
            return cls(spec, None)
        try:
            if ".." in spec:
                start_text, end_text = spec.split("..", 1)
                start, end = int(start_text), int(end_text)
                if start < 0 or end <= start:
                    raise Refusal(f"layer range {spec} is empty: a..b selects a up to but not including b")
                return cls(spec, tuple(range(start, end)))
            indices = tuple(int(part) for part in spec.split(","))
        except ValueError:
            raise Refusal(f'{_SHAPE}; got "{text}"') from None
        if any(index < 0 for index in indices):
            raise Refusal(f'{_SHAPE}; got "{text}"')
        return cls(spec, indices)

    def resolve(self, num_layers: int) -> list[int]:
        """Sorted, de-duplicated indices, refusing any layer the model does not have."""
        if self.indices is None:
            return list(range(num_layers))
        for index in self.indices:
            if index >= num_layers:
                raise Refusal(
                    f"layer {index} is out of range: this model has {num_layers} layers, "
                    f"numbered 0..{num_layers - 1}"
                )
        return sorted(set(self.indices))
