"""The app's own words for a bad field, and for engine sentences written for the command line.

The engine refuses a bad value in a sentence that names the CLI flag ("--max-new-tokens
must be at least 1"), and a value the request model cannot parse in the validation
library's words ("Input should be a valid number"). A person in the app typed into a
field labelled "max tokens", so the forms check their fields here first, naming each
field as its label does, and :func:`in_our_words` rewrites whatever engine sentence
still reaches a pane. The checks parse with the engine's own parsers (strength, layers),
so the app accepts exactly what the engine does. Nothing here imports textual or torch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ster.engine.protocol.errors import Refusal

if TYPE_CHECKING:
    from ster.engine.steering.strength import Strength

LABELS = {
    "strength": "strength",
    "strengths": "sweep",
    "max-new-tokens": "max tokens",
    "temperature": "temp (temperature)",
    "seed": "seed",
    "top-p": "top p",
    "layers": "layers",
    "output": "artifact",
    "vector": "artifact",
    "pairs": "pair set",
    "count": "pairs to keep",
    "batch-size": "batch size",
    "prompt": "prompt",
    "trait": "trait",
    "model": "model",
    "prompts": "prompts",
}
"""CLI flag (without its dashes) → the label of the form field that sets it."""
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
    """An engine sentence as the app says it: form labels for flags, plain words for the library's phrases."""
    if sentence.startswith("no pair set is active in the workspace"):
        return NO_PAIRS
    for pattern, replacement in PHRASES:
        sentence = pattern.sub(replacement, sentence)
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: LABELS.get(m.group(1), m.group(1).replace("-", " ")), sentence)


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


def parse_strengths(text: str) -> list[Strength]:
    """The sweep field's strengths; they must share one unit (0 goes with either)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError("sweep needs at least one strength, e.g. -0.4x,0.4x")
    strengths = [parse_strength(part, "each sweep strength") for part in parts]
    if len({s.unit for s in strengths if s.value}) > 1:
        raise ValueError("sweep mixes units: write every strength as a number (3) or every one with an x (0.4x)")
    return strengths


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


def parse_whole(text: str, label: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f'{label} is a whole number; "{text}" is not') from None
    if value < low or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{label} must be {span}")
    return value


def parse_temperature(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f'temp (temperature) is a number, 0 to decode greedily; "{text}" is not') from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("temp (temperature) must be a finite number of at least 0; 0 decodes greedily")
    return value


def parse_layers(text: str) -> str:
    """The layers field as the engine's selector parses it (the syntax only; the model says how many exist)."""
    from ster.engine.steering.layers import LayerSpec

    try:
        LayerSpec.parse(text)
    except Refusal as exc:
        raise ValueError(in_our_words(str(exc))) from None
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
