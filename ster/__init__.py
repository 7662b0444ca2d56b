"""Ster: representation reading, activation steering and LoRA training for causal language models.

``import ster`` gives the Python API (:mod:`ster.api`): ``ster.open(model)`` and the jobs on it, ``ster.steer``
and ``ster.read`` on a transformers model you hold, and the conversions to and from the Python peers. Its names
are loaded on first use, so that importing ``ster`` imports neither torch nor textual (``ster --help`` and the
TUI's first paint stay fast), and nothing heavy until a model is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ster.api import (
        Cancelled,
        GenerateOptions,
        InterventionOptions,
        Model,
        Refusal,
        SamplingOptions,
        SterError,
        SterWarning,
        TuneOptions,
        export_peft,
        from_peer,
        import_model,
        inspect,
        inspect_adapter,
        load_artifact,
        open,
        read,
        steer,
        to_repeng,
        to_steering_vectors,
    )

__all__ = [
    "Cancelled",
    "GenerateOptions",
    "InterventionOptions",
    "Model",
    "Refusal",
    "SamplingOptions",
    "SterError",
    "SterWarning",
    "TuneOptions",
    "__version__",
    "export_peft",
    "from_peer",
    "import_model",
    "inspect",
    "inspect_adapter",
    "load_artifact",
    "open",
    "read",
    "steer",
    "to_repeng",
    "to_steering_vectors",
]

API = frozenset(__all__) - {"__version__"}
"""The names ``ster`` loads from :mod:`ster.api` on first use (its ``__all__``)."""


def __getattr__(name: str) -> Any:
    if name in API:
        from ster import api

        return getattr(api, name)
    raise AttributeError(f"module 'ster' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
