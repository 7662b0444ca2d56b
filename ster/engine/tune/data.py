"""The data a tune run reads: supervised examples, preference pairs, and prompts.

Each loader returns plain records and refuses a file that does not fit in one
sentence. Two shapes of file are read:

* the original's JSON documents, as they are: an example set ``{"name"?, "examples":
  [{"prompt", "completion"}]}``, a pair set (the positive side chosen, the negative
  rejected), and a prompt set ``{"prompts": [...]}``;
* JSON Lines with the column names of the ecosystem's SFT and preference datasets (TRL's):
  ``prompt``/``completion`` (text, or TRL's conversational form: a list of messages and
  one assistant turn), ``messages`` conversations, and ``prompt``/``chosen``/``rejected``
  (the prompt shared by both sides; without one, conversational sides share their
  leading turns as the prompt). Columns a record does not use are ignored, so a
  dataset's ids and scores may stay in it.

Which shape a file has is decided by its content: a file that parses as one JSON value
is a document (unless it is a single record that lacks the document's key), a file whose
first line is a JSON value on its own is JSON Lines, and anything else is refused as a
malformed document. A ``.jsonl`` suffix always means JSON Lines. Blank lines are skipped;
a refusal names the file, the 1-based line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import DuplicateKey, read_json, unique_keys
from ster.engine.protocol.inputs import lone_surrogate, may_hold_surrogate, read_input_text, surrogate_phrase

Message = dict[str, str]
"""One turn of a conversation: ``{"role": ..., "content": ...}``."""

Prompt = str | list[Message]
"""A text (rendered as one user turn under a template), or the turns of a conversation."""


@dataclass(frozen=True)
class Example:
    """A supervised example: the model learns to continue ``prompt`` with ``completion``."""

    prompt: Prompt
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
    prompt: Prompt | None = None


@dataclass(frozen=True)
class PreferenceSet:
    label: str
    name: str | None
    pairs: list[Preference]


@dataclass(frozen=True)
class _Line:
    """One record of a JSON Lines file, with the line it came from (1-based)."""

    number: int
    record: dict[str, Any]


# --- examples ---------------------------------------------------------------------------------------------------


def load_examples(path: Path) -> ExampleSet:
    """Read an example set, refusing an empty one or an example with an empty side."""
    document, lines = _read(path, "example set", "examples", {"prompt", "completion", "messages"})
    if lines is None:
        return _example_document(path, document)
    examples = [_example(line, path) for line in lines]
    if not examples:
        raise Refusal(f"example set {path} contains no examples")
    for line, example in zip(lines, examples):
        if not _filled(example.prompt) or not example.completion.strip():
            raise Refusal(f"example set {path} contains an empty prompt or completion at line {line.number}")
    return ExampleSet(str(path), None, examples)


def _example_document(path: Path, raw: Any) -> ExampleSet:
    if not isinstance(raw, dict) or not isinstance(raw.get("examples"), list):
        raise Refusal(f'invalid example set JSON in {path}: expected {{"examples": [{{"prompt", "completion"}}]}}')
    examples = []
    for index, item in enumerate(raw["examples"]):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("prompt"), str)
            or not isinstance(item.get("completion"), str)
        ):
            raise Refusal(
                f"invalid example set JSON in {path}: example {index} needs a prompt and a completion, both text"
            )
        examples.append(Example(item["prompt"], item["completion"]))
    if not examples:
        raise Refusal(f"example set {path} contains no examples")
    if any(not _filled(e.prompt) or not e.completion.strip() for e in examples):
        raise Refusal(f"example set {path} contains an empty prompt or completion")
    name = raw.get("name")
    return ExampleSet(str(path), name if isinstance(name, str) else None, examples)


def _example(line: _Line, path: Path) -> Example:
    """``prompt``/``completion`` (either may be conversational), or a ``messages`` conversation."""
    record, where = line.record, f"{path} line {line.number}"
    if "completion" in record or ("prompt" in record and "messages" not in record):
        if "prompt" not in record:
            raise Refusal(f'{where} has a "completion" but no "prompt"')
        if "completion" not in record:
            raise Refusal(f'{where} has a "prompt" but no "completion"')
        return Example(_prompt(record["prompt"], "prompt", where), _answer(record["completion"], "completion", where))
    if "messages" in record:
        turns = _messages(record["messages"], "messages", where)
        if turns[-1]["role"] != "assistant":
            raise Refusal(f'{where}: "messages" must end with an assistant turn, the completion to learn')
        return Example(turns[:-1], turns[-1]["content"])
    raise Refusal(f"{where} has neither prompt/completion nor messages")


def _filled(prompt: Prompt) -> bool:
    return bool(prompt.strip()) if isinstance(prompt, str) else any(m["content"].strip() for m in prompt)


# --- preference pairs -------------------------------------------------------------------------------------------


def load_preferences(path: Path | None) -> PreferenceSet:
    """Read preference pairs: a pair set (the workspace's active set when no path is given), or JSON Lines."""
    from ster.engine.pairs.workspace import load_pairs_or_active

    if path is not None:
        _, lines = _read(path, "pair set", "pairs", {"prompt", "chosen", "rejected"})
        if lines is not None:
            return _preference_lines(path, lines)
    where, pair_set = load_pairs_or_active(path)
    pairs = [Preference(p.positive, p.negative) for p in pair_set.pairs]
    return PreferenceSet(str(where), pair_set.trait_name or None, pairs)


def _preference_lines(path: Path, lines: list[_Line]) -> PreferenceSet:
    pairs = [_preference(line, path) for line in lines]
    if not pairs:
        raise Refusal(f"pair set {path} contains no pairs")
    for line, pair in zip(lines, pairs):
        if not pair.chosen.strip() or not pair.rejected.strip():
            raise Refusal(f"pair set {path} contains an empty positive or negative prompt at line {line.number}")
        if pair.prompt is not None and not _filled(pair.prompt):
            raise Refusal(
                f'pair set {path} has an empty "prompt" at line {line.number}; leave the field out '
                "for a pair without one"
            )
    return PreferenceSet(str(path), None, pairs)


def _preference(line: _Line, path: Path) -> Preference:
    """``chosen``/``rejected`` with an optional ``prompt``, each text or a list of messages."""
    record, where = line.record, f"{path} line {line.number}"
    missing = [field for field in ("chosen", "rejected") if field not in record]
    if len(missing) == 2:
        raise Refusal(f"{where} has neither chosen nor rejected")
    if missing:
        raise Refusal(f'{where} has no "{missing[0]}"')
    prompt = _prompt(record["prompt"], "prompt", where) if record.get("prompt") is not None else None
    chosen, rejected = record["chosen"], record["rejected"]
    for field, side in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(side, (str, list)):
            raise Refusal(f'{where}: "{field}" must be text or a list of messages')
    if isinstance(chosen, str) and isinstance(rejected, str):
        return Preference(chosen, rejected, prompt)
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise Refusal(f'{where}: "chosen" and "rejected" must both be text or both lists of messages')
    head = prompt if isinstance(prompt, list) else []
    pair = _shared_prompt(
        [*head, *_messages(chosen, "chosen", where)], [*head, *_messages(rejected, "rejected", where)], where
    )
    if pair.prompt is None and isinstance(prompt, str):
        return Preference(pair.chosen, pair.rejected, prompt)
    return pair


def _shared_prompt(chosen: list[Message], rejected: list[Message], where: str) -> Preference:
    """Conversational sides: the turns both share are the prompt, and each side's last turn its answer.

    A text prompt beside conversational sides (as UltraFeedback writes it) repeats their
    first turn, so the shared turns win; it is the prompt only when the sides share none.
    """
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    for field, side in (("chosen", chosen), ("rejected", rejected)):
        if len(side) - shared != 1 or side[-1]["role"] != "assistant":
            raise Refusal(f'{where}: "{field}" must end in one assistant turn after the turns both sides share')
    return Preference(chosen[-1]["content"], rejected[-1]["content"], chosen[:shared] or None)


# --- prompts ----------------------------------------------------------------------------------------------------


def load_prompts(path: Path) -> list[Prompt]:
    """Read prompts: a prompt set ``{"prompts": [...]}``, or JSON Lines of ``prompt`` or ``messages``.

    A plain prompt stays a ``str`` (what ``encode_prompt`` takes); a conversational one is
    its list of messages, every turn before a final assistant turn (so a file of SFT
    conversations serves as prompts too).
    """
    document, lines = _read(path, "prompt set", "prompts", {"prompt", "messages"})
    if lines is None:
        prompts = document.get("prompts") if isinstance(document, dict) else None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise Refusal(f'prompt set {path} is not in the expected shape: expected {{"prompts": ["...", ...]}}')
    else:
        prompts = [_prompt_record(line, path) for line in lines]
        for line, prompt in zip(lines, prompts):
            if not _filled(prompt):
                raise Refusal(f"prompt set {path} contains an empty prompt at line {line.number}")
    if not prompts:
        raise Refusal(f"prompt set {path} contains no prompts")
    return prompts


def _prompt_record(line: _Line, path: Path) -> Prompt:
    record, where = line.record, f"{path} line {line.number}"
    if "prompt" in record:
        return _prompt(record["prompt"], "prompt", where)
    if "messages" in record:
        turns = _messages(record["messages"], "messages", where)
        return turns[:-1] if turns[-1]["role"] == "assistant" else turns
    raise Refusal(f"{where} has neither prompt nor messages")


# --- fields -----------------------------------------------------------------------------------------------------


def _prompt(value: Any, field: str, where: str) -> Prompt:
    return value if isinstance(value, str) else _messages(value, field, where)


def _answer(value: Any, field: str, where: str) -> str:
    """A completion: text, or TRL's conversational form, a list holding one assistant turn."""
    if isinstance(value, str):
        return value
    turns = _messages(value, field, where)
    if len(turns) != 1 or turns[0]["role"] != "assistant":
        raise Refusal(f'{where}: "{field}" must be text or a list of one assistant turn')
    return turns[0]["content"]


def _messages(value: Any, field: str, where: str) -> list[Message]:
    """A non-empty list of ``{"role", "content"}`` turns, both text; other keys of a turn are dropped."""
    if not isinstance(value, list) or not value:
        kind = "a list of messages" if field == "messages" else "text or a list of messages"
        raise Refusal(f'{where}: "{field}" must be {kind}')
    for number, turn in enumerate(value, start=1):
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("role"), str)
            or not isinstance(turn.get("content"), str)
        ):
            raise Refusal(f'{where}: message {number} of "{field}" needs a text "role" and a text "content"')
    return [{"role": turn["role"], "content": turn["content"]} for turn in value]


# --- reading ----------------------------------------------------------------------------------------------------


def _read(path: Path, what: str, key: str, columns: set[str]) -> tuple[Any, list[_Line] | None]:
    """The parsed document and None, or None and the records of a JSON Lines file.

    ``key`` marks the document (``examples``); ``columns`` mark a record, so that a file
    holding one record on one line is read as JSON Lines rather than refused as a document.
    """
    text = _text(path, what)
    if path.suffix.lower() != ".jsonl" and text.strip():
        try:
            whole = json.loads(text, object_pairs_hook=unique_keys)
        except json.JSONDecodeError:
            first = next(line for line in text.split("\n") if line.strip())
            if not _parses(first):
                return read_json(path, what), None  # a malformed document: refused with the shared sentence
        except (DuplicateKey, RecursionError):
            return read_json(path, what), None
        else:
            if not (isinstance(whole, dict) and key not in whole and columns & whole.keys()):
                return read_json(path, what), None
            line = _Line(_first_line(text), whole)
            if may_hold_surrogate(text):
                _check_text(line, path)
            return None, [line]
    return None, _lines(text, path)


def _text(path: Path, what: str) -> str:
    """The file's text: a regular file only (a FIFO is refused, never waited on)."""
    real = confine.readable(path)
    if not real.exists():
        raise Refusal(f"{what} {path} does not exist")
    if real.is_dir():
        raise Refusal(f"{what} {path} is a directory, not a JSON file")
    return read_input_text(real, what)


def _lines(text: str, path: Path) -> list[_Line]:
    """Every non-blank line as one JSON object.

    Lines split at ``\\n`` only: a JSON string may hold U+2028 and the other separators
    ``str.splitlines`` would cut at.
    """
    records = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as exc:
            raise Refusal(f"{path} line {number} is not valid JSON: {exc.msg} at column {exc.colno}") from None
        except DuplicateKey as exc:
            raise Refusal(
                f'{path} line {number} gives the key "{exc.key}" twice, so which value is meant is ambiguous'
            ) from None
        except RecursionError:
            raise Refusal(f"{path} line {number} nests its arrays or objects too deeply to be read") from None
        if not isinstance(record, dict):
            raise Refusal(f"{path} line {number} is not a JSON object")
        records.append(_Line(number, record))
        if may_hold_surrogate(line):
            _check_text(records[-1], path)
    return records


def _check_text(line: _Line, path: Path) -> None:
    """Refuse a record holding a lone surrogate: no tokenizer encodes it."""
    found = lone_surrogate(line.record)
    if found is not None:
        raise Refusal(
            f'{path} line {line.number} holds {surrogate_phrase(found[1])} at "{found[0]}", which is not '
            "a character; write the character itself or a valid surrogate pair"
        )


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def _first_line(text: str) -> int:
    return next(number for number, line in enumerate(text.split("\n"), start=1) if line.strip())
