"""llama.cpp's control-vector GGUF, read and written: the file ``llama-cli --control-vector`` loads.

The format is what llama.cpp's loader (``common_control_vector_load_one`` in common/common.cpp) reads, and what
its ``cvector-generator`` and repeng's ``ControlVector.export_gguf`` write: a GGUF of architecture
``controlvector`` with ``controlvector.model_hint`` (the model's architecture) and ``controlvector.layer_count``
(the number of directions in the file, written as int32 by llama.cpp and as uint32 by repeng), and one 1-D F32
tensor ``direction.N`` per steered block, already scaled by its strength. llama.cpp's loader reads no metadata at
all, so neither does Ster's past the architecture and the hint: a ``layer_count`` of any type, or none, is read.

llama.cpp adds ``direction.N`` to the output of block N, counted from 0 as Ster counts blocks (its graph calls
``build_cvec(cur, il)`` after block ``il``, and ``llama_set_adapter_cvec`` puts ``direction.N`` in the slot of
``il = N``), so a block's index is its tensor's N, as in repeng's files (llama.cpp's cvector-generator names
``direction.N`` what it read after block N − 1; read here, it is where llama.cpp applies it, after block N). Block 0 cannot be steered through the
format: the loader refuses a whole file that holds ``direction.0``, and one with a non-F32 or non-1-D tensor, a
name it cannot parse, or directions of two widths. ``tests/steering/test_llama_cpp_reference.py`` checks the
indexing against llama.cpp itself.

Reading refuses, in one sentence each, everything llama.cpp's loader refuses, and a file of another architecture
(a model's GGUF); files written with ``steeringvector.*`` keys instead of ``controlvector.*`` are read alike.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ster.engine.protocol import confine, inflight
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import write_atomic

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    Vector = Sequence[float] | Tensor | np.ndarray[Any, Any]

ARCHITECTURE = "controlvector"
"""What llama.cpp's cvector-generator and repeng write as ``general.architecture`` and as the keys' prefix."""
ARCHITECTURES = (ARCHITECTURE, "steeringvector")
"""The prefixes read: llama.cpp's and repeng's, and the ``steeringvector`` some writers use."""
_NAME = re.compile(r"direction\.(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class ControlVector:
    """A control vector as read: per block, the vector llama.cpp adds to that block's output."""

    model_hint: str | None
    """The architecture the file says it was made for (``llama``, ``gemma3``); None where it says none."""
    layers: dict[int, list[float]]
    """Per block index (0-based, the residual stream after that block), the vector added there."""
    width: int
    """The number of values in every vector: the model's hidden size."""


def write_control_vector(path: Path, vectors: Mapping[int, Vector], model_hint: str) -> None:
    """Write ``vectors`` (block index → the vector to add after that block, strength included) as llama.cpp's
    control-vector GGUF, atomically; refuse before writing anything that llama.cpp would refuse."""
    arrays = _checked(vectors, model_hint, path)
    gguf = _gguf()
    scratch = Path(inflight.temp_directory(prefix=".ster-cvec.", suffix=inflight.SUFFIX))
    try:
        staged = scratch / "control-vector.gguf"
        writer = gguf.GGUFWriter(str(staged), ARCHITECTURE)
        writer.add_string(f"{ARCHITECTURE}.model_hint", model_hint)
        writer.add_int32(f"{ARCHITECTURE}.layer_count", len(arrays))  # as llama.cpp's cvector-generator writes it
        for block, values in sorted(arrays.items()):
            writer.add_tensor(f"direction.{block}", values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        data = staged.read_bytes()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        inflight.unregister(scratch)
    write_atomic(path, data)


def _checked(vectors: Mapping[int, Vector], model_hint: str, path: Path) -> dict[int, np.ndarray[Any, Any]]:
    """Each block's vector as F32, refusing what the format cannot hold or llama.cpp would refuse."""
    import numpy as np

    if not model_hint.strip():
        raise Refusal(f"{path} was not written: a control vector names the architecture it was made for")
    if not vectors:
        raise Refusal(f"{path} was not written: there is no vector to write")
    arrays: dict[int, np.ndarray[Any, Any]] = {}
    for block, vector in vectors.items():
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise Refusal(
                f"{path} was not written: block {block} cannot be steered through a control vector, whose "
                "directions llama.cpp adds after blocks 1 onwards (block 0 and negative indices are not in the format)"
            )
        values = _floats(vector)
        if values.ndim != 1 or values.size == 0:
            raise Refusal(f"{path} was not written: block {block}'s vector is not a list of values")
        if not np.isfinite(values).all():
            raise Refusal(f"{path} was not written: block {block}'s vector holds a value that is not a finite float32")
        arrays[block] = values
    widths = {block: values.size for block, values in arrays.items()}
    if len(set(widths.values())) > 1:
        (first, width), (other, wrong) = min(widths.items()), _other_width(widths)
        raise Refusal(
            f"{path} was not written: block {other}'s vector has {wrong} values where block {first}'s has {width}, "
            "and a control vector's directions share one width"
        )
    return arrays


def _floats(vector: Vector) -> np.ndarray[Any, Any]:
    """The vector as float32 values (a tensor is read from any device and dtype)."""
    import numpy as np

    if hasattr(vector, "detach"):
        vector = vector.detach().float().cpu().numpy()
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused as not finite
        return np.asarray(vector, dtype=np.float64).astype(np.float32)


def _other_width(widths: dict[int, int]) -> tuple[int, int]:
    """The first block whose width differs from the lowest block's."""
    first = widths[min(widths)]
    return next((block, width) for block, width in sorted(widths.items()) if width != first)


def read_control_vector(path: Path) -> ControlVector:
    """Read a llama.cpp or repeng control-vector GGUF; refuse, in one sentence, anything llama.cpp would refuse."""
    real = confine.readable(path)
    if not real.exists():
        raise Refusal(f"control vector {path} does not exist")
    if real.is_dir():
        raise Refusal(f"control vector {path} is a directory, not a GGUF file")
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(real))
        fields, tensors = reader.fields, list(reader.tensors)
    except Exception:  # the reader raises ValueError, struct.error, IndexError and more on a damaged file
        raise Refusal(f"{path} is truncated or not a GGUF file") from None
    architecture = _string(fields, "general.architecture")
    if architecture is not None and architecture not in ARCHITECTURES:
        raise Refusal(f"{path} is a GGUF of architecture {architecture}, not a control vector")
    prefixes = (architecture, *ARCHITECTURES) if architecture is not None else ARCHITECTURES  # its own first
    hint = next(
        (_string(fields, f"{prefix}.model_hint") for prefix in prefixes if f"{prefix}.model_hint" in fields), None
    )
    layers = _directions(path, tensors, gguf.GGMLQuantizationType.F32)
    return ControlVector(model_hint=hint, layers=layers, width=len(next(iter(layers.values()))))


def _directions(path: Path, tensors: list[Any], f32: Any) -> dict[int, list[float]]:
    """Block index → values of each ``direction.N`` tensor, checked as llama.cpp's loader checks them."""
    import numpy as np

    if not tensors:
        raise Refusal(f"{path} holds no direction tensors, so it steers nothing")
    layers: dict[int, list[float]] = {}
    for tensor in tensors:
        name = str(tensor.name)
        found = _NAME.fullmatch(name)
        if found is None:
            raise Refusal(f"{path} holds a tensor {name}, where a control vector holds only tensors named direction.N")
        if found.group(1) == "0":
            raise Refusal(f"{path} holds direction.0, which llama.cpp refuses (the format steers blocks 1 onwards)")
        if tensor.tensor_type != f32:
            raise Refusal(f"{path}: tensor {name} is {tensor.tensor_type.name}, where llama.cpp reads only F32")
        values = np.asarray(tensor.data).reshape(-1)
        if len(tensor.shape) != 1 or values.size != int(tensor.n_elements) or values.size == 0:
            raise Refusal(f"{path}: tensor {name} is not a one-dimensional list of values, as llama.cpp requires")
        if not np.isfinite(values).all():
            raise Refusal(f"{path}: tensor {name} holds a value that is not finite")
        layers[int(found.group(1))] = [float(x) for x in values]
    _one_width(path, layers)
    return dict(sorted(layers.items()))


def _one_width(path: Path, layers: dict[int, list[float]]) -> None:
    widths = {block: len(values) for block, values in layers.items()}
    if len(set(widths.values())) > 1:
        first, (other, wrong) = min(widths), _other_width(widths)
        raise Refusal(
            f"{path}: direction.{other} has {wrong} values where direction.{first} has {widths[first]}, "
            "and llama.cpp refuses directions of two widths"
        )


def _string(fields: Mapping[str, Any], key: str) -> str | None:
    """A metadata string, or None where the key is absent or holds no string."""
    if key not in fields:
        return None
    try:
        value = fields[key].contents()
    except Exception:  # a field of a type contents() cannot decode is as good as absent here
        return None
    return value if isinstance(value, str) else None


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise Refusal('control-vector GGUFs need the gguf package: pip install "ster[gguf]"') from None
    return gguf
