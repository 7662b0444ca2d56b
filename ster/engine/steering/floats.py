"""Writing f32 values into JSON documents."""

from __future__ import annotations

from typing import Any

import numpy as np


def f32_values(values: Any) -> list[float]:
    """f32 values as the shortest decimals that read back to the same f32.

    A float32 widened to a Python float prints with 17 digits of which 9 mean
    anything; this keeps the document half the size and exactly as precise.
    """
    return [float(str(value)) for value in np.asarray(values, dtype=np.float32)]
