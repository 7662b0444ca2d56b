"""One-line form fields that show their whole value and check it as it is typed.

Textual's input keeps its text scrolled so that the cursor is visible, so a value set
from a key (``[`` lowers the strength) or typed to the end of a narrow box showed its
tail: ``-1.4`` read as ``1.4``. A :class:`Field` grows with its value instead, and
when it loses focus it scrolls back to the start. Its check is one of the parsers in
:mod:`ster.tui.words`; a failing check marks the field and carries the sentence, so a
pane can show it and clear it as soon as the text is fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.validation import ValidationResult, Validator
from textual.widgets import Input, Label, Static

from ster.tui.typed import InApp


class Check(Validator):
    """A parser as a validator: the parser's ValueError is the failure, in the parser's words."""

    def __init__(self, parse: Callable[[str], Any]) -> None:
        super().__init__()
        self.parse = parse

    def validate(self, value: str) -> ValidationResult:
        try:
            self.parse(value)
        except ValueError as exc:
            return self.failure(str(exc), value)
        return self.success()


class Field(Input):
    """A compact input; ``grow`` makes it as wide as its text (between ``width`` and ``grow`` cells)."""

    DEFAULT_CSS = """
    Field.-textual-compact { padding: 0 1; background: $boost; }
    Field.-textual-compact:focus { background: $primary 25%; }
    Field.-textual-compact.-invalid { background: $error 30%; }
    """

    def __init__(
        self,
        value: str = "",
        *,
        check: Callable[[str], Any] | None = None,
        width: int | None = None,
        grow: int | None = None,
        passthrough: frozenset[str] = frozenset(),
        **kwargs: Any,
    ) -> None:
        self.min_width, self.max_width, self.passthrough = width, grow, passthrough  # read while Input sets value
        super().__init__(value, compact=True, validators=[Check(check)] if check else None, **kwargs)
        self._fit(value)

    def error(self) -> str | None:
        """The check's sentence for the text as it is now; None when it passes (or there is no check)."""
        result = self.validate(self.value)
        return None if result is None or result.is_valid else result.failure_descriptions[0]

    def watch_value(self, value: str) -> None:
        self._fit(value)

    def watch_placeholder(self) -> None:
        self._fit(self.value)

    def _fit(self, value: str) -> None:
        if self.min_width is not None:
            wanted = len(value or getattr(self, "placeholder", "")) + 3  # padding each side, one for the cursor
            self.styles.width = max(self.min_width, min(wanted, self.max_width or self.min_width))

    def _on_blur(self, event: events.Blur) -> None:  # Textual runs Input's own handler as well
        self.scroll_to(x=0, animate=False, immediate=True)

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character not in self.passthrough and super().check_consume_key(key, character)

    async def _on_key(self, event: events.Key) -> None:
        if event.character in self.passthrough:
            event.prevent_default()  # the input would type it; unhandled, it bubbles to the pane's bindings


def checked_by(job: str, field: str, valid: dict[str, Any], shown: str | None = None, **options: Any) -> Field:
    """A field for a request field of ``job``: at that request's default (or ``shown``), and checked by that
    request's own checks beside the otherwise passing ``valid`` (:func:`ster.tui.words.request_check`)."""
    from ster.engine.protocol.jobs import request_default
    from ster.tui.words import request_check

    return Field(
        request_default(job, field) if shown is None else shown, check=request_check(job, field, valid), **options
    )


def labelled(label: str, field: Input | Any, hint: str = "") -> ComposeResult:
    """A label and its field (and an optional dim hint after it), as parts of a form row."""
    yield Label(label, classes="field-label")
    yield field
    if hint:
        yield Label(hint, classes="field-hint")


class FormRow(Horizontal):
    """One line of labelled fields."""

    DEFAULT_CSS = """
    FormRow { height: 1; margin-bottom: 1; }
    FormRow .field-label { padding: 0 1 0 0; color: $text-muted; }
    FormRow .field-label.-gap { padding: 0 1 0 2; }
    FormRow .field-hint { padding: 0 0 0 1; color: $text-disabled; width: 1fr; }
    """


class MessageLine(InApp):
    """The message line under a pane's form (a ``Static`` with id ``message``): one sentence, or lines added."""

    shown_error: str | None = None

    def say(self, text: str, style: str) -> None:
        """Show only ``text`` (nothing hides the line)."""
        self.shown_error = None
        message = self.query_one("#message", Static)
        message.update(Text(text, style=style))
        message.display = bool(text)

    def add(self, text: str, style: str) -> None:
        """One more line under what the message line shows."""
        message = self.query_one("#message", Static)
        current = message.content if isinstance(message.content, Text) else Text(str(message.content))
        message.update(Text("\n").join([current, Text(text, style=style)]) if current.plain else Text(text, style))
        message.display = True


class FieldErrors(InApp):
    """For a pane with checked fields: refuse a run while one is bad, and clear its sentence once it is fixed.

    The pane provides ``say(text, style)`` for its message line.
    """

    if TYPE_CHECKING:

        def say(self, text: str, style: str) -> None: ...

    shown_error: str | None = None
    """The id of the field whose sentence the message line shows now."""

    def first_bad(self, *ids: str) -> bool:
        """Show the first bad field's sentence (and focus it); True when one is bad, so nothing runs."""
        for field_id in ids:
            field = self.query_one(f"#{field_id}", Field)
            error = field.error()
            if error:
                self.say(error, "red")
                self.shown_error = field_id
                return True
        return False

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == self.shown_error and isinstance(event.input, Field) and event.input.error() is None:
            self.shown_error = None
            self.say("", "")
