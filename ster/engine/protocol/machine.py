"""What a benchmark, a cache key or a report says of the CPU it ran on. Imports nothing heavy."""

from __future__ import annotations

import os
import platform

INSTRUCTION_SETS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "asimdhp",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
    "sme",
)
"""The instruction sets a matrix kernel can use: what the kernel cache's key and the benchmarks name of a CPU."""


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of :data:`INSTRUCTION_SETS` it has (from /proc/cpuinfo on Linux)."""
    name, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return name, [flag for flag in INSTRUCTION_SETS if flag in flags]


def cpu_line() -> str:
    """``CPU: <model> (<instruction sets>), <n> cores``."""
    name, flags = cpu_description()
    return f"CPU: {name} ({', '.join(flags) or 'none of the listed matrix instruction sets'}), {os.cpu_count()} cores"
