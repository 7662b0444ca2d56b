"""The app's own words: its labels for the request fields its forms set, and plain words for the rest.

The engine names a field in its sentences through :func:`ster.engine.protocol.naming.flag`; the app runs
its checks and its jobs under :func:`~ster.engine.protocol.naming.named` with :data:`LABELS` (or a pane's own
labels), so a refusal comes out naming the field as the form labels it ("max tokens must be at least 1"),
composed that way rather than rewritten. What is left to say in the app's words is the validation library's
phrases ("Input should be a valid number") in a document a job read, and the app's own guidance where an
error's facts call for it (no pair set: where to get one in the app). Nothing here imports textual or torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ster.engine.protocol.errors import Refusal

if TYPE_CHECKING:
    from ster.engine.protocol.events import Error
    from ster.engine.steering.strength import Strength


class Labels(dict[str, str]):
    """The app's words for request fields: a field without a label of its own is its name in words."""

    def __missing__(self, field: str) -> str:
        return field.replace("_", " ")

    def but(self, **labels: str) -> Labels:
        """These labels, with some fields labelled as one pane's form labels them."""
        return Labels({**self, **labels})


LABELS = Labels(
    {
        "strength": "strength",
        "strengths": "sweep",
        "max_new_tokens": "max tokens",
        "temperature": "temp (temperature)",
        "seed": "seed",
        "top_p": "top p",
        "layers": "layers",
        "output": "artifact",
        "vector": "artifact",
        "pairs": "pair set",
        "count": "pairs to keep",
        "batch_size": "batch size",
        "prompt": "prompt",
        "trait": "trait",
        "model": "model",
        "prompts": "prompts",
        "mode": "mode",
    }
)
"""Request field → the label of the form field that sets it (the Steering tabs'; the Tune and Adapters tabs
label some fields their own way)."""
STRENGTH_SPELLING = "a number such as 3, or a multiple of the layer's activation spread such as 0.4x"
PHRASES = (
    (re.compile(r"Input should be a valid number.*"), "give a number"),
    (re.compile(r"Input should be a valid integer.*"), "give a whole number"),
    (re.compile(r"Input should be greater than or equal to (\S+)"), r"give at least \1"),
    (re.compile(r"Input should be (.*)"), r"give \1"),
    (re.compile(r"Field required"), "fill it in"),
)
"""The validation library's phrases, as the app says them."""
NO_PAIRS = (
    "no pair set to work on yet: open one in the Pairs tab (1, then o) or write one there and save it "
    "(s); the Train tab uses the saved file"
)


def in_our_words(sentence: str) -> str:
    """An engine sentence with the validation library's phrases (in a file a job read) in plain words."""
    for pattern, replacement in PHRASES:
        sentence = pattern.sub(replacement, sentence)
    return sentence


def said(final: Error) -> str:
    """What the app says of a job that ended in an error: the engine's sentence, or the app's own guidance
    where the error's facts call for it (the engine needed a pair set and the workspace has none active)."""
    if (final.details or {}).get("needs") == "pairs":
        return NO_PAIRS
    return in_our_words(final.message)


def parse_strength(text: str, label: str = "strength") -> Strength:
    """The strength a field holds (an engine ``Strength``); ValueError in the app's words."""
    from pydantic import ValidationError

    from ster.engine.steering.strength import Strength

    try:
        return Strength.model_validate(text)
    except ValidationError as exc:
        if "finite" in str(exc):
            raise ValueError(f"{label} must be a finite number") from None
        raise ValueError(f'{label} is {STRENGTH_SPELLING}; "{text}" is neither') from None


def parse_prompt_set(text: str) -> str | None:
    """The sweep's prompt-set field: None when empty (the tab's own prompt), else a file path or the reserved
    name of a bundled prompt set (``ster:prompts``), as the engine takes it; a reserved name that does not
    exist is refused here, a missing file by the engine."""
    from ster.engine.protocol.paths import PREFIX, example_path

    typed = text.strip()
    if not typed:
        return None
    if typed.startswith(PREFIX):
        try:
            example_path(typed)
        except ValueError as exc:
            raise ValueError(f"prompts: {exc}") from None
        return typed
    return str(Path(typed).expanduser())


def request_check(
    job: str, field: str, valid: dict[str, Any], names: Mapping[str, str] = LABELS
) -> Callable[[str], None]:
    """A form field's check by the job's own request: the text refused as it would be in a request that is
    otherwise ``valid``, in the request's sentence naming the field by ``names`` (a ValueError)."""

    def check(text: str) -> None:
        from ster.engine.protocol.jobs import request_class
        from ster.engine.protocol.naming import named
        from ster.engine.protocol.requests import refusal_of

        with named(names):
            sentence = refusal_of(request_class(job), valid, field, text)
        if sentence is not None:
            raise ValueError(in_our_words(sentence))

    return check


def parse_layers(text: str) -> str:
    """The layers field as the engine's selector parses it (the syntax only; the model says how many exist)."""
    from ster.engine.protocol.naming import named
    from ster.engine.steering.layers import LayerSpec

    try:
        with named(LABELS):
            LayerSpec.parse(text)
    except Refusal as exc:
        raise ValueError(str(exc)) from None
    return text


def format_number(value: float) -> str:
    """A number as a field shows it: no float noise (0.30000000000000004 → 0.3), no trailing .0."""
    return f"{round(value, 6):g}"


def parse_adapter(text: str, local: bool = True) -> Path | None:
    """The Generate tab's adapter field: None when empty (or ``none``), else the adapter's path: a LoRA
    ``.safetensors`` file with its ``.json`` sidecar beside it, or a PEFT adapter directory. With ``local``
    (the jobs run in this process, so on these files) the path is read here, so a wrong one is one sentence
    before anything runs; the engine checks the model and width it was trained for when the job starts."""
    from ster.engine.model.adapters.artifact import read_sidecar

    typed = text.strip()
    if not typed or typed.lower() == "none":
        return None
    path = Path(typed).expanduser()
    if not local:
        return path
    if path.is_dir():
        if not (path / "adapter_config.json").is_file():
            raise ValueError(
                f"adapter {typed} is a directory without adapter_config.json: name a LoRA "
                ".safetensors file or a PEFT adapter directory"
            )
        return path
    if path.suffix == ".json" and path.with_suffix(".safetensors").exists():
        raise ValueError(
            f"adapter {typed} is the sidecar; name the adapter beside it, {path.with_suffix('.safetensors').name}"
        )
    if not path.exists():
        raise ValueError(f"adapter {typed} does not exist")
    if path.suffix != ".safetensors":
        raise ValueError(
            f"adapter {typed} is not a LoRA adapter: name its .safetensors file (with the .json "
            "sidecar beside it) or a PEFT adapter directory"
        )
    try:
        sidecar = read_sidecar(path)
    except Refusal as exc:
        raise ValueError(str(exc)) from None
    if sidecar.kind == "reward":
        raise ValueError(f"adapter {typed} is a reward model, not a generation adapter")
    return path
