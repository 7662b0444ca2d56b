"""The CPU kernels of the decoder's projections, chosen by timing them on this machine.

Every projection of Ster's decoder is ``x @ weight.T + bias`` (:func:`matmul`). PyTorch offers
several ways to compute it, and which is fastest depends on the CPU, not on the model: on one
2-core AMD EPYC ``weight @ x.T`` beat ``F.linear`` for a few f32 rows by 1.7×, and on a 2-core
Intel Xeon with AVX-512 the same kernel lost to ``F.linear`` by 1.3×, so a rule fixed on one
machine made the decoder slower than transformers on the other. The choice is therefore measured:
for each precision and each class of row count (:data:`CLASSES`: one row, a decode step; two to
eight, a sampled group's or a sweep's step; nine to 64, a served batch's step; more, a prefill or a
training forward) the candidates
of :data:`CANDIDATES` are timed on the model's own weights when a model is first loaded on a
machine, and the fastest is used from then on. Every candidate computes the same product; they
differ only in the order of the float sums (and, for the int8 kernel, in rounding its input to
bf16, as that kernel always has), which the tests hold to the same tolerance as ``F.linear``.

The choice is kept in ``$XDG_CACHE_HOME/ster/kernels.json`` (``~/.cache/ster``), keyed by the CPU
model and its instruction sets, torch's version, its thread count, the precision and the weights'
shapes, so another CPU, torch or thread count measures again. ``STER_KERNELS`` says what to do:

- ``cached`` (the default): use the cached choice, and measure (and cache) when there is none;
- ``measure``: measure now, whatever is cached, and cache the result;
- ``default``: no timing and no cache: the built-in choice of :data:`DEFAULTS`.

The table is one per process, per precision (the kernels are properties of the CPU; a second model
of other shapes loaded at the same precision replaces the first one's choice with its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.machine import cpu_description, cpu_line

Precision = Literal["f32", "f16", "bf16", "int8"]
ShapeClass = Literal["one", "few", "batch", "many"]
CLASSES: tuple[ShapeClass, ...] = ("one", "few", "batch", "many")
FEW_ROWS = 8
"""The most rows of the ``few`` class; more are ``batch``."""
BATCH_ROWS = 64
"""The most rows of the ``batch`` class (a continuous batch's decode step); more are ``many``."""
TIMED_ROWS: dict[ShapeClass, int] = {"one": 1, "few": 4, "batch": 16, "many": 128}
"""The rows each class is timed at."""
CLASS_WORDS: dict[ShapeClass, str] = {
    "one": "one row",
    "few": f"2-{FEW_ROWS} rows",
    "batch": f"{FEW_ROWS + 1}-{BATCH_ROWS} rows",
    "many": "more rows",
}

KERNEL_WORDS = {
    "linear": "F.linear",
    "wxt": "weight @ x.T",
    "native": "F.linear without oneDNN",
    "upcast": "F.linear at f32",
    "int8pack": "PyTorch's int8-weight kernel",
    "dequant": "torchao's linear",
}
"""How the progress stream and the benchmarks name each kernel."""

CANDIDATES: dict[Precision, dict[ShapeClass, tuple[str, ...]]] = {
    "f32": {"one": ("linear", "wxt"), "few": ("linear", "wxt"), "batch": ("linear", "wxt"), "many": ("linear",)},
    "f16": {
        "one": ("linear", "wxt"),
        "few": ("linear", "wxt", "upcast"),
        "batch": ("linear", "wxt", "upcast"),
        "many": ("linear", "upcast"),
    },
    "bf16": {
        "one": ("linear", "native", "wxt"),
        "few": ("linear", "native", "wxt"),
        "batch": ("linear", "native", "wxt"),
        "many": ("linear", "native", "upcast"),
    },
    "int8": {
        "one": ("int8pack", "dequant"),
        "few": ("int8pack", "dequant"),
        "batch": ("int8pack", "dequant"),
        "many": ("dequant",),
    },
}
"""What is timed for each precision and class. ``upcast`` is not a one-row candidate: it converts the
whole weight to f32 for a product that reads it once, so it cannot win there and would only cost time."""


def _slow_half_gemm() -> bool:
    """An x86 CPU without AMX-FP16: PyTorch multiplies f16 matrices there without a vectorised kernel."""

    try:
        return bool(torch.cpu._is_avx2_supported() and not torch.cpu._is_amx_fp16_supported())
    except AttributeError:  # a torch without these probes: assume the fast kernel exists
        return False


def _defaults() -> dict[Precision, dict[ShapeClass, str]]:
    """The choice without measuring: what Ster used before kernels were measured (measured on an AMD EPYC)."""
    return {
        "f32": {"one": "wxt", "few": "wxt", "batch": "wxt", "many": "linear"},
        "f16": {
            "one": "linear",
            "few": "upcast" if _slow_half_gemm() else "linear",
            "batch": "upcast" if _slow_half_gemm() else "linear",
            "many": "upcast" if _slow_half_gemm() else "linear",
        },
        "bf16": {"one": "native", "few": "linear", "batch": "linear", "many": "linear"},
        "int8": {"one": "int8pack", "few": "int8pack", "batch": "dequant", "many": "dequant"},
    }


# --- the kernels -------------------------------------------------------------------------------------------------


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:

    return F.linear(x, weight, bias)


def _wxt(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T`` computed as ``weight @ x.T``.

    For a handful of rows ``F.linear`` may go to MKL's matrix-vector kernel (one row, one thread)
    or to a matrix-matrix kernel that first copies the whole weight into its blocked layout; with
    the weight as the left operand the product streams it once, on every thread. A single row is
    doubled, because on some CPUs the two-column product beats the vector kernel.
    """

    flat = x.reshape(-1, x.shape[-1])
    single = flat.shape[0] == 1
    y = torch.mm(weight, torch.cat((flat, flat)).T if single else flat.T)  # [N, rows] (rows doubled when single)
    y = (y[:, :1] if single else y).T.contiguous().view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def _native(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` with oneDNN off for the call: PyTorch's own kernel (bf16's matrix-vector one reads the
    weights up to twice as fast as oneDNN's on some CPUs). The switch is torch's global flag, restored."""

    if not torch._C._get_mkldnn_enabled():
        return F.linear(x, weight, bias)
    torch._C._set_mkldnn_enabled(False)
    try:
        return F.linear(x, weight, bias)
    finally:
        torch._C._set_mkldnn_enabled(True)


def _upcast(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The product in f32, rounded back once: the same numbers, for CPUs without a fast half-precision gemm."""

    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


def _int8pack(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    from ster.engine.model.quantize import int8_kernel_linear  # torchao's module, imported only at int8

    return int8_kernel_linear(x, weight, bias)


def _dequant(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:

    return F.linear(x, weight, bias)  # torchao's own linear for its tensor type


KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor | None], Tensor]] = {
    "linear": _linear,
    "wxt": _wxt,
    "native": _native,
    "upcast": _upcast,
    "int8pack": _int8pack,
    "dequant": _dequant,
}

DTYPES: dict[str, torch.dtype] = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
"""The activations' dtype of each unquantized precision."""


class Table:
    """The kernel of each (precision, class): what :func:`matmul` runs. One per process."""

    def __init__(self) -> None:
        self._chosen: dict[tuple[object, ShapeClass], Callable[[Tensor, Tensor, Tensor | None], Tensor]] = {}
        self.names: dict[Precision, dict[ShapeClass, str]] = {}
        self.reset()

    def reset(self) -> None:
        """Back to the built-in choice for every precision."""
        for precision, choice in _defaults().items():
            self.use(precision, choice)

    def use(self, precision: Precision, choice: dict[ShapeClass, str]) -> None:
        key: object = "int8" if precision == "int8" else DTYPES[precision]
        self.names[precision] = dict(choice)
        for shape in CLASSES:
            self._chosen[(key, shape)] = KERNELS[choice[shape]]

    def kernel(self, key: object, shape: ShapeClass) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
        return self._chosen.get((key, shape), _linear)


_TABLE: Table | None = None


def table() -> Table:
    global _TABLE
    if _TABLE is None:
        _TABLE = Table()
    return _TABLE


def shape_class(rows: int) -> ShapeClass:
    return "one" if rows == 1 else "few" if rows <= FEW_ROWS else "batch" if rows <= BATCH_ROWS else "many"


PLAIN = (torch.nn.Parameter, torch.Tensor)
"""The types of a plain (not quantized) weight: anything else is a torchao tensor."""


def matmul(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` through the chosen kernel of the weight's precision and the rows' class.

    Off the CPU, and for a dtype no precision holds, it is ``F.linear``. An int8 (torchao) product that
    needs a gradient always takes torchao's linear: PyTorch's int8 kernel has no backward.
    """
    if x.device.type != "cpu" or x.numel() == 0:
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    if type(weight) not in PLAIN:
        if x.requires_grad and torch.is_grad_enabled():
            return F.linear(x, weight, bias)
        return table().kernel("int8", shape_class(rows))(x, weight, bias)
    return table().kernel(x.dtype, shape_class(rows))(x, weight, bias)


# --- measuring ---------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """A precision's choice, how it was arrived at, and what the timing cost."""

    precision: Precision
    choice: dict[ShapeClass, str]
    how: Literal["measured", "cached", "default"]
    seconds: float = 0.0
    times: dict[str, dict[str, float]] = field(default_factory=dict)
    """Median seconds of one timed pass, by class and candidate (measured only; a candidate dropped early has its
    first time)."""
    path: Path | None = None

    def sentence(self) -> str:
        """The progress line of a measurement."""
        parts = ", ".join(f"{CLASS_WORDS[shape]} {KERNEL_WORDS[self.choice[shape]]}" for shape in CLASSES)
        where = f"; kept in {self.path}" if self.path is not None else ""
        return (
            f"timed the CPU kernels of {self.precision} products on this machine in {self.seconds:.2f} s: "
            f"{parts}{where} for this CPU, torch and thread count"
        )


Timer = Callable[[str, str, Callable[[], object]], float]
"""``timer(class, candidate, run)``: seconds of one ``run()``. The real one is :func:`wall_time`."""


def wall_time(shape: str, candidate: str, run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


TIMED_BYTES = 128 << 20
"""Weights read per timed pass besides the output head: more than a CPU's last-level cache, so a pass reads
memory, as a decode step over the whole model does."""
ROUNDS = 3
GIVE_UP = 1.5
"""A candidate whose first pass is this many times the best first pass is not timed again: it cannot win."""


def projections_to_time(weights: Sequence[Tensor], shape: ShapeClass) -> list[Tensor]:
    """The weights a pass of ``shape`` times: for one row, a few and a batch, the last weight (the output head,
    the widest) and the others in order until :data:`TIMED_BYTES`; for more rows, which are bound by arithmetic
    rather than memory, one of each distinct shape but the head's (a prefill projects its last position only)."""
    if shape == "many":
        seen: dict[tuple[int, ...], Tensor] = {}
        for weight in weights[:-1] or weights:
            seen.setdefault(tuple(weight.shape), weight)
        return list(seen.values())
    chosen, total = [weights[-1]], 0
    for weight in weights[:-1]:
        if total >= TIMED_BYTES:
            break
        chosen.append(weight)
        total += _nbytes(weight)
    return chosen


def _nbytes(weight: Tensor) -> int:
    qdata = getattr(weight, "qdata", None)
    if qdata is not None:
        scale: Tensor = cast(Any, weight).scale  # an int8 (torchao) weight's per-row scales
        return int(qdata.numel() * qdata.element_size() + scale.numel() * scale.element_size())
    return int(weight.numel() * weight.element_size())


def measure(
    weights: Sequence[Tensor], precision: Precision, timer: Timer = wall_time, rounds: int = ROUNDS
) -> tuple[dict[ShapeClass, str], dict[str, dict[str, float]]]:
    """Time every candidate of every class on ``weights`` (the decoder's projections in the order a forward
    runs them, the output head last); return the fastest of each class and the median times."""

    dtype = torch.float32 if precision == "int8" else DTYPES[precision]
    generator = torch.Generator().manual_seed(0)
    choice: dict[ShapeClass, str] = {}
    times: dict[str, dict[str, float]] = {}
    for shape in CLASSES:
        candidates = CANDIDATES[precision][shape]
        if len(candidates) == 1:
            choice[shape] = candidates[0]
            continue
        timed = projections_to_time(weights, shape)
        inputs = {w.shape[1]: torch.randn(TIMED_ROWS[shape], w.shape[1], generator=generator).to(dtype) for w in timed}

        def run(
            kernel: Callable[[Tensor, Tensor, Tensor | None], Tensor],
            timed: list[Tensor] = timed,
            inputs: dict[int, Tensor] = inputs,
        ) -> None:
            for weight in timed:
                kernel(inputs[weight.shape[1]], weight, None)

        seen: dict[str, list[float]] = {name: [] for name in candidates}
        with torch.inference_mode():
            for name in candidates:  # a warm-up call on the smallest weight: first-call allocations stay out
                smallest = min(timed, key=_nbytes)
                KERNELS[name](inputs[smallest.shape[1]], smallest, None)
            for index in range(rounds):
                best_first = min((v[0] for v in seen.values() if v), default=None)
                for name in candidates:
                    if index > 0 and best_first is not None and seen[name][0] > GIVE_UP * best_first:
                        continue
                    seen[name].append(timer(shape, name, partial(run, KERNELS[name])))
        medians = {name: statistics.median(values) for name, values in seen.items()}
        times[shape] = medians
        choice[shape] = min(candidates, key=lambda name: medians[name])
    return choice, times


# --- the cache ---------------------------------------------------------------------------------------------------

MODES = ("measure", "cached", "default")


def mode() -> str:
    value = os.environ.get("STER_KERNELS", "").strip() or "cached"
    if value not in MODES:
        raise Refusal(f"STER_KERNELS is {value!r}; give measure, cached or default")
    return value


def machine_line() -> str:
    """One line naming the CPU, its instruction sets, its cores and torch's threads: what every benchmark prints."""
    return f"{cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads"


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ster" / "kernels.json"


def cache_key(precision: Precision, weights: Sequence[Tensor], threads: int) -> str:
    """What a cached choice is valid for: the CPU and its instruction sets, torch, its threads, the precision
    and the shapes of the weights."""

    name, flags = cpu_description()
    shapes = sorted({tuple(int(n) for n in w.shape) for w in weights})
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    return f"{name} [{' '.join(flags)}] | torch {torch.__version__} | {threads} threads | {precision} | shapes {digest}"


def _read_cache(path: Path) -> dict[str, dict[str, Any]]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again and written whole
    entries = document.get("entries") if isinstance(document, dict) else None
    return entries if isinstance(entries, dict) else {}


def _valid(entry: object, precision: Precision) -> dict[ShapeClass, str] | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("choice"), dict):
        return None
    choice = entry["choice"]
    if all(choice.get(shape) in CANDIDATES[precision][shape] for shape in CLASSES):
        return {shape: choice[shape] for shape in CLASSES}
    return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the cache's lock file while it is read and rewritten, so two processes measuring at once keep both
    entries."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the last writer's whole file wins, which loses at most a measurement
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_entry(path: Path, key: str, entry: dict[str, Any]) -> bool:
    from ster.engine.protocol.files import write_atomic

    try:
        with _locked(path):
            entries = _read_cache(path)
            entries[key] = entry
            write_atomic(path, json.dumps({"schema": 1, "entries": entries}, indent=1, sort_keys=True) + "\n")
        return True
    except (OSError, Refusal):
        return False  # a read-only or full cache directory: the choice holds for this process only


def choose(
    weights: Sequence[Tensor], precision: Precision, timer: Timer = wall_time, how: str | None = None
) -> Measured:
    """The kernels of ``precision`` for a model whose projections are ``weights`` (forward order, head last),
    by ``STER_KERNELS`` (or ``how``), put into the process's table."""

    how = how or mode()
    if how == "default":
        result = Measured(precision, _defaults()[precision], "default")
        table().use(precision, result.choice)
        return result
    path = cache_path()
    key = cache_key(precision, weights, torch.get_num_threads())
    if how == "cached":
        cached = _valid(_read_cache(path).get(key), precision)
        if cached is not None:
            result = Measured(precision, cached, "cached", path=path)
            table().use(precision, result.choice)
            return result
    start = time.perf_counter()
    choice, times = measure(weights, precision, timer)
    seconds = time.perf_counter() - start
    name, flags = cpu_description()
    entry = {
        "choice": choice,
        "times": times,
        "seconds": round(seconds, 3),
        "cpu": name,
        "instruction_sets": flags,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "precision": precision,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    kept = _write_entry(path, key, entry)
    result = Measured(precision, choice, "measured", seconds, times, path if kept else None)
    table().use(precision, choice)
    return result


def precision_of(weight: Tensor) -> Precision:
    """The precision a decoder whose weights look like ``weight`` runs at."""
    if getattr(weight, "qdata", None) is not None:
        return "int8"
    return next(cast(Precision, name) for name, dtype in DTYPES.items() if dtype == weight.dtype)


# --- the machine's memory ----------------------------------------------------------------------------------------


def read_bandwidth(megabytes: int = 512, passes: int = 5) -> float:
    """Bytes per second a streaming read of a ``megabytes`` f32 buffer reaches (the best of ``passes``), on
    torch's threads: a physical bound on how fast a decode step can read its weights, if the buffer is larger
    than the last-level cache."""

    buffer = torch.ones(megabytes << 18)  # f32: 4 bytes each
    buffer.sum()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best
