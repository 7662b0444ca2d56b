"""The data a tune run reads: supervised examples, preference pairs, and prompts.

Each loader returns plain records and refuses a file that does not fit in one
sentence. The original's JSON documents are read as they are: an example set
``{"name"?, "examples": [{"prompt", "completion"}]}``, a pair set (the positive side
chosen, the negative rejected), and a prompt set ``{"prompts": [...]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import read_json

Message = dict[str, str]
"""One turn of a conversation: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True)
class Example:
    """A supervised example: the model learns to continue ``prompt`` with ``completion``."""

    prompt: str | list[Message]
    """A text, or the conversation before the answer (every turn but the last assistant one)."""
    completion: str


@dataclass(frozen=True)
class ExampleSet:
    label: str
    """How sentences name the set: its path."""
    name: str | None
    examples: list[Example]


@dataclass(frozen=True)
class Preference:
    """A preference pair: ``chosen`` preferred over ``rejected``, both continuing ``prompt`` when there is one."""

    chosen: str
    rejected: str
    prompt: str | list[Message] | None = None


@dataclass(frozen=True)
class PreferenceSet:
    label: str
    name: str | None
    pairs: list[Preference]


def load_examples(path: Path) -> ExampleSet:
    """Read an example set, refusing an empty one or an example with an empty side."""
    raw = read_json(path, "example set")
    if not isinstance(raw, dict) or not isinstance(raw.get("examples"), list):
        raise Refusal(f'invalid example set JSON in {path}: expected {{"examples": [{{"prompt", "completion"}}]}}')
    examples = [_example(item, path, index) for index, item in enumerate(raw["examples"])]
    if not examples:
        raise Refusal(f"example set {path} contains no examples")
    if any(not _text(e.prompt) or not e.completion.strip() for e in examples):
        raise Refusal(f"example set {path} contains an empty prompt or completion")
    name = raw.get("name")
    return ExampleSet(str(path), name if isinstance(name, str) else None, examples)


def _example(item: Any, path: Path, index: int) -> Example:
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) \
            or not isinstance(item.get("completion"), str):
        raise Refusal(f"invalid example set JSON in {path}: example {index} needs a prompt and a completion, "
                      "both text")
    return Example(item["prompt"], item["completion"])


def _text(prompt: str | list[Message]) -> bool:
    return bool(prompt.strip()) if isinstance(prompt, str) else any(m.get("content", "").strip() for m in prompt)


def load_preferences(path: Path | None) -> PreferenceSet:
    """Read a pair set as preferences (the workspace's active set when no path is given)."""
    from ster.engine.pairs.workspace import load_pairs_or_active

    where, pair_set = load_pairs_or_active(path)
    pairs = [Preference(p.positive, p.negative) for p in pair_set.pairs]
    return PreferenceSet(str(where), pair_set.trait_name or None, pairs)


def load_prompts(path: Path) -> list[str]:
    """Read a prompt set ``{"prompts": [...]}``."""
    raw = read_json(path, "prompt set")
    prompts = raw.get("prompts") if isinstance(raw, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise Refusal(f'prompt set {path} is not in the expected shape: expected {{"prompts": ["...", ...]}}')
    if not prompts:
        raise Refusal(f"prompt set {path} contains no prompts")
    return prompts
