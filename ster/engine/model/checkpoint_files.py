"""A checkpoint directory's files as jobs that write a new checkpoint read them: every shard's tensor names,
and the config, tokenizer, chat template and generation config copied under their usual names.

``tune merge`` (an adapter folded in) and ``bake`` (a direction folded in) both write an ordinary checkpoint
directory of the family's own layout: one ``model.safetensors`` beside the source's other files.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

from ster.engine.model.resolve import ModelSource
from ster.engine.protocol.errors import Refusal

WEIGHTS = "model.safetensors"


def shard_headers(weights: tuple[Path, ...]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Tensor name → (its shard, its header entry) across every shard, refusing a name two shards both hold."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in weights:
        for name, entry in _header(path).items():
            if name in found:
                raise Refusal(
                    f"tensor {name} is in both {found[name][0].name} and {path.name}; a checkpoint names "
                    "each tensor once, so this one is refused rather than half-merged"
                )
            found[name] = (path, entry)
    return found


def _header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(min(length, 100_000_000)))
    except (OSError, struct.error, ValueError):
        raise Refusal(f"weights file {path} could not be read") from None
    if not isinstance(header, dict):
        raise Refusal(f"weights file {path} could not be read")
    header.pop("__metadata__", None)
    return header


def copy_checkpoint_files(source: ModelSource, staging: Path) -> list[str]:
    """The source's config, tokenizer, chat template and generation config, under their usual names."""
    files = {
        "config.json": source.config,
        "tokenizer.json": source.tokenizer,
        "tokenizer_config.json": source.tokenizer_config,
        "chat_template.jinja": source.chat_template_file,
        "generation_config.json": source.generation_config,
        "special_tokens_map.json": _optional(source.root / "special_tokens_map.json"),
    }
    copied = []
    for name, path in files.items():
        if path is not None:
            shutil.copyfile(path, staging / name)
            copied.append(name)
    return copied


def _optional(path: Path) -> Path | None:
    return path if path.is_file() else None
