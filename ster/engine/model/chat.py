"""Chat templates: finding a checkpoint's own template, deciding whether to apply it, rendering it.

Rendering uses jinja2's immutable sandbox configured as Hugging Face's renderer
configures it (trim_blocks, lstrip_blocks, loop controls, a ``tojson`` that keeps
non-ASCII text), with the two globals that renderer adds: ``raise_exception`` and
``strftime_now``. Unlike that renderer, a value the template prints or iterates
but nobody defined is an error naming the template's line, never an empty string:
wrongly marked text is worse than none. Testing an undefined value (``is defined``,
``if x``) stays legal, because templates do that on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.sandbox

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import read_json

ChatDecision = Literal["applied", "absent", "off"]

DECISION_SENTENCES: dict[ChatDecision, str] = {
    "applied": "applying the model's own chat template to every prompt and completion",
    "absent": "this model publishes no chat template, so prompts and completions are encoded as raw text",
    "off": "chat template off, so prompts and completions are encoded as raw text",
}
"""The one sentence each decision is reported with on the progress stream."""

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
_TEMPLATE_NAME = "<chat template>"


def decide(mode: Literal["auto", "off"], template: str | None) -> ChatDecision:
    """``off`` when asked; otherwise ``applied`` if the checkpoint publishes a template, else ``absent``."""
    if mode == "off":
        return "off"
    return "applied" if template else "absent"


def special_tokens(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special-token strings a tokenizer config declares (plain strings or AddedToken dicts)."""
    found: dict[str, str] = {}
    for name in _SPECIAL_TOKENS:
        value = tokenizer_config.get(name)
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            found[name] = value
    return found


def find_template(tokenizer_config: Mapping[str, Any], template_file: Path | None) -> str | None:
    """The checkpoint's default chat template: tokenizer_config.json's ``chat_template``
    (a string, or a list of named templates whose ``default`` is used), else chat_template.jinja."""
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, Mapping)}
        value = named.get("default")
    if isinstance(value, str) and value.strip():
        return value
    if template_file is not None:
        text = template_file.read_text(encoding="utf-8")
        return text if text.strip() else None
    return None


def read_tokenizer_config(path: Path | None) -> dict[str, Any]:
    """tokenizer_config.json as a dict, or an empty one when the checkpoint has none."""
    if path is None:
        return {}
    raw = read_json(path, "tokenizer config")
    if not isinstance(raw, dict):
        raise Refusal(f"tokenizer config {path} is not a JSON object")
    return raw


class _TemplateUndefined(jinja2.Undefined):
    """Undefined values may be tested, but printing, iterating or measuring one is an error."""

    def __str__(self) -> str:
        self._fail_with_undefined_error()
        return ""

    __iter__ = jinja2.StrictUndefined.__iter__
    __len__ = jinja2.StrictUndefined.__len__


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols], undefined=_TemplateUndefined
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _template_line(tb: TracebackType | None) -> int | None:
    """The line of the template being rendered when the error was raised, if it was inside it."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_NAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special tokens its tokenizer config declares."""

    source: str
    special: Mapping[str, str]
    _template: jinja2.Template

    @classmethod
    def compile(cls, source: str, special: Mapping[str, str]) -> ChatTemplate:
        """Compile the template, refusing a syntax error with its line."""
        try:
            template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise Refusal(f"the chat template does not parse: {exc.message} (template line {exc.lineno})") from None
        template.filename = _TEMPLATE_NAME
        return cls(source, dict(special), template)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """Render a conversation, refusing any failure with the template line it happened on."""
        context = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "tools": None,
            "documents": None,
            **self.special,
        }
        try:
            return self._template.render(**context)
        except jinja2.UndefinedError as exc:
            line = _template_line(exc.__traceback__)
            if "'bos_token' is undefined" in str(exc):
                raise Refusal(
                    f"the chat template writes bos_token (template line {line}), but the tokenizer config "
                    f"declares no bos_token"
                ) from None
            raise Refusal(f"the chat template uses something undefined: {exc.message} (template line {line})") from None
        except jinja2.TemplateError as exc:
            line = _template_line(exc.__traceback__)
            raise Refusal(f"the chat template failed: {exc.message} (template line {line})") from None
        except Exception as exc:  # a template can raise anything a sandboxed expression can
            line = _template_line(exc.__traceback__)
            raise Refusal(f"the chat template failed: {type(exc).__name__}: {exc} (template line {line})") from None

    def render_prompt(self, prompt: str) -> str:
        """A user turn followed by the marker that opens the assistant's answer."""
        return self.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
