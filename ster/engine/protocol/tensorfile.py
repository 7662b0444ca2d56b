"""A safetensors file read wholly, without torch: its header checked against its bytes, its values by numpy.

The readers of Ster's own tensor files (an adapter, a PEFT adapter's weights, a training
checkpoint) must refuse a damaged file in one sentence before they use a value of it. What
the header alone cannot show is checked here: the file holds exactly the bytes its header
describes (a file cut short, or one with bytes after its last tensor, is refused), every
tensor's offsets match its dtype and shape and the tensors tile the data without gaps or
overlap, and each value can be decoded. :meth:`TensorFile.floats` gives a floating-point
tensor as a numpy array, so finiteness and magnitudes are checked before anything is loaded.

Nothing here imports torch; a damaged file raises :class:`Damaged` with a phrase that the
caller puts after the file's name.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_HEADER = 100_000_000
"""The largest header a reader parses (the bound the safetensors library itself uses)."""
SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
"""Bytes per element of every dtype a safetensors header may name."""
FLOATS = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": None}
"""The floating-point dtypes numpy decodes (bf16 through its upper half of an f32)."""


class Damaged(ValueError):
    """A file that is not the safetensors file it claims to be; the message is a phrase ("is truncated: …")."""


@dataclass(frozen=True)
class TensorFile:
    """A parsed safetensors file: every tensor's entry, the metadata, and the data section."""

    tensors: dict[str, dict[str, Any]]
    """Name → {"dtype", "shape", "data_offsets"}, in the header's order."""
    metadata: dict[str, str]
    data: memoryview

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name]["shape"])

    def dtype(self, name: str) -> str:
        return str(self.tensors[name]["dtype"])

    def floats(self, name: str) -> np.ndarray:
        """The tensor as a read-only numpy array (f64 stays f64, every other float becomes f32)."""
        entry = self.tensors[name]
        begin, end = entry["data_offsets"]
        raw = self.data[begin:end]
        code = FLOATS[entry["dtype"]]
        if code is None:  # bf16 is the upper half of an f32
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=code)
        return values.reshape(entry["shape"]).astype(np.float64 if code == "<f8" else np.float32, copy=False)


def parse(raw: bytes) -> TensorFile:
    """Parse a safetensors file's bytes, checking the header against the data; :class:`Damaged` otherwise."""
    if len(raw) < 8:
        raise Damaged(f"is not a safetensors file (it holds {len(raw)} bytes, fewer than a header's length)")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > min(MAX_HEADER, len(raw)):
        raise Damaged("is not a safetensors file (its first 8 bytes are not the length of a header it holds)")
    if 8 + length > len(raw):
        raise Damaged(f"is truncated (its header runs to byte {8 + length}, and the file holds {len(raw)})")
    try:
        header = json.loads(bytes(raw[8 : 8 + length]))
    except (ValueError, RecursionError):
        raise Damaged("is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise Damaged("is not a safetensors file (its header is not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise Damaged("is not a safetensors file (its __metadata__ is not an object of strings)")
    data = memoryview(raw)[8 + length :]
    return TensorFile(
        {name: _entry(name, entry) for name, entry in header.items()}, metadata, _check_tiling(header, data)
    )


def _entry(name: str, entry: Any) -> dict[str, Any]:
    """One header entry, checked: a known dtype, a shape of whole numbers, offsets spanning exactly its bytes."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise Damaged(f"is not a safetensors file (its header's entry for {name} is not dtype, shape and data_offsets)")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in SIZES:
        raise Damaged(f"names dtype {dtype!r} for tensor {name}, which is not a safetensors dtype")
    if not (isinstance(shape, list) and all(_whole(n) for n in shape)):
        raise Damaged(f"gives tensor {name} the shape {shape!r}, which is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(n) for n in offsets)):
        raise Damaged(f"gives tensor {name} the offsets {offsets!r}, which are not a start and an end")
    count = math.prod(shape)
    if offsets[1] - offsets[0] != count * SIZES[dtype]:
        raise Damaged(
            f"gives tensor {name} {offsets[1] - offsets[0]} bytes where its shape {shape} of {dtype} "
            f"takes {count * SIZES[dtype]}"
        )
    return entry


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tiling(header: dict[str, Any], data: memoryview) -> memoryview:
    """The tensors must tile the data section exactly: from byte 0, no gap, no overlap, nothing after."""
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, stop = entry["data_offsets"]
        if begin != end:
            raise Damaged(
                f"is not a safetensors file (tensor {name} starts at byte {begin} of the data, where the "
                f"tensors before it end at {end})"
            )
        end = stop
    if end > len(data):
        raise Damaged(f"is truncated (its header describes {end} bytes of tensor data, and the file holds {len(data)})")
    if end < len(data):
        raise Damaged(f"holds {len(data) - end} bytes after its last tensor, which no safetensors writer leaves")
    return data
