"""A checkpoint's fingerprint: what a model *is*, so an artifact can name it wherever it lies.

A ``--model`` string says where a checkpoint lies, not what it is: the same directory
has many spellings, a copy lies elsewhere, and the checkpoint at one path can change.
The fingerprint hashes what decides the residual stream a direction was fitted in:

* config.json's architecture fields (everything the decoder reads except the special
  token ids and ``max_position_embeddings``, which change no state);
* per tensor, in name order across every weights file (so a resharded copy matches):
  its name, dtype and shape, and a sample of its bytes — the whole tensor up to
  :data:`WHOLE_TENSOR_BYTES`, else :data:`WINDOWS` windows of :data:`WINDOW_BYTES`
  spread evenly from its first byte to its last.

It reads the safetensors headers and a few small windows with plain file reads: no
torch, no mapping of the weights, about a millisecond per hundred tensors. A change
confined to bytes no window reads goes unseen; a fine-tune, a merge, a re-quantisation
or another dtype changes every window of every tensor it touches.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from ster.engine.model.config import DecoderConfig
from ster.engine.protocol.errors import Refusal

SCHEME = "ster-fp1"
"""The prefix of every fingerprint: a fingerprint under another scheme is not compared, only the name is."""
WHOLE_TENSOR_BYTES = 4096
WINDOWS = 8
WINDOW_BYTES = 256
_MAX_HEADER = 100 * 1024 * 1024


def checkpoint_fingerprint(config: DecoderConfig, weights: tuple[Path, ...]) -> str:
    """``ster-fp1:`` and a SHA-256 hex digest of the architecture and the sampled tensors."""
    digest = hashlib.sha256()
    architecture = config.architecture()
    architecture.update(num_key_value_heads=config.kv_heads, head_dim=config.head_size)
    digest.update(json.dumps(architecture, sort_keys=True).encode())
    tensors: list[tuple[str, str, list[int], bytes]] = []
    for path in weights:
        fd = _open(path)
        try:
            tensors += [
                (name, dtype, shape, _sample(fd, path, begin, end))
                for name, (dtype, shape, begin, end) in _header(path).items()
            ]
        finally:
            os.close(fd)
    for name, dtype, shape, sample in sorted(tensors):
        digest.update(json.dumps([name, dtype, shape]).encode())
        digest.update(sample)
    return f"{SCHEME}:{digest.hexdigest()}"


def short(fingerprint: str) -> str:
    """The first 12 hex digits, enough to tell two fingerprints apart in a sentence."""
    return fingerprint.rpartition(":")[2][:12]


def _header(path: Path) -> dict[str, tuple[str, list[int], int, int]]:
    """Each tensor's dtype, shape and absolute byte range, from a safetensors file's JSON header."""
    try:
        with path.open("rb") as handle:
            raw_size = handle.read(8)
            size = struct.unpack("<Q", raw_size)[0] if len(raw_size) == 8 else -1
            if not 0 < size <= min(_MAX_HEADER, path.stat().st_size - 8):
                raise ValueError("its header length is not that of a safetensors file")
            header = json.loads(handle.read(size))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Refusal(f"weights file {path} could not be read: {exc}") from None
    return {name: _entry(path, name, entry, 8 + size) for name, entry in header.items() if name != "__metadata__"}


def _entry(path: Path, name: str, entry: Any, base: int) -> tuple[str, list[int], int, int]:
    try:
        begin, end = (int(x) for x in entry["data_offsets"])
        dtype, shape = str(entry["dtype"]), [int(n) for n in entry["shape"]]
    except (TypeError, KeyError, ValueError):
        raise Refusal(
            f"weights file {path} could not be read: tensor {name} has no dtype, shape and data_offsets in its header"
        ) from None
    if not 0 <= begin <= end:
        raise Refusal(f"weights file {path} could not be read: tensor {name} has data_offsets {begin}..{end}")
    return dtype, shape, base + begin, base + end


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise Refusal(f"weights file {path} could not be read: {exc.strerror}") from None


def _sample(fd: int, path: Path, begin: int, end: int) -> bytes:
    """The tensor's bytes when it is small, else evenly spread windows of them."""
    length = end - begin
    if length <= WHOLE_TENSOR_BYTES:
        starts = [begin] if length else []
        width = length
    else:
        step = (length - WINDOW_BYTES) / (WINDOWS - 1)
        starts = [begin + round(i * step) for i in range(WINDOWS)]
        width = WINDOW_BYTES
    try:
        chunks = [os.pread(fd, width, start) for start in starts]
    except OSError as exc:
        raise Refusal(f"weights file {path} could not be read: {exc.strerror}") from None
    if any(len(chunk) != width for chunk in chunks):
        raise Refusal(f"weights file {path} could not be read: it ends before the tensor data its header names")
    return b"".join(chunks)
