"""Turning text into token ids and back, exactly as the checkpoint's own tokenizer does.

Raw text goes through the tokenizer's full pipeline, so its post-processor alone
decides whether a BOS or EOS is added. Text rendered through a chat template is
encoded without special tokens, because the rendered string already spells every
marker the template wanted; adding them again would put a second BOS in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from ster.engine.model.chat import ChatDecision, ChatTemplate
from ster.engine.protocol.errors import Refusal


def load_tokenizer(path: Path) -> Tokenizer:
    """Read tokenizer.json, refusing a file the tokenizers library cannot parse."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises its own untyped exception
        raise Refusal(f"tokenizer {path} could not be read: {exc}") from None


@dataclass(frozen=True)
class TextCodec:
    """Encoding under one chat-template decision, and decoding of generated ids."""

    tokenizer: Tokenizer
    decision: ChatDecision
    template: ChatTemplate | None
    """The compiled template when ``decision`` is ``applied``, else None."""
    eos_ids: frozenset[int]

    def encode_prompt(self, prompt: str) -> list[int]:
        """Ids of a prompt: a rendered user turn under a template, the raw text otherwise."""
        if self.template is not None:
            ids = self.tokenizer.encode(self.template.render_prompt(prompt), add_special_tokens=False).ids
        else:
            ids = self.tokenizer.encode(prompt).ids
        if not ids:
            raise Refusal("the prompt encodes to no tokens; give some text")
        return ids

    def encode_answer(self, turns: list[dict[str, str]], raw_prompt: str, answer: str) -> tuple[list[int], list[int]]:
        """Ids of a prompt (with the marker that opens the assistant's turn) and of an answer after it.

        Under a template the conversation is rendered twice, the prompt alone and with the answer, and the
        answer is the difference, its turn's end marker included; neither half gets the tokenizer's own special
        tokens. Without one the prompt is ``raw_prompt`` as raw text and the answer has no special tokens."""
        if self.template is None:
            return self.tokenizer.encode(raw_prompt).ids, self.tokenizer.encode(answer, add_special_tokens=False).ids
        head = self.template.render(turns, add_generation_prompt=True)
        whole = self.template.render([*turns, {"role": "assistant", "content": answer}], add_generation_prompt=False)
        if not whole.startswith(head):
            raise Refusal(
                "the chat template renders the conversation with a different beginning than the prompt "
                "alone, so the completion cannot be told apart from the prompt"
            )
        return (
            self.tokenizer.encode(head, add_special_tokens=False).ids,
            self.tokenizer.encode(whole[len(head) :], add_special_tokens=False).ids,
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Text of generated ids, without special tokens."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream(self) -> DecodeStream:
        """An incremental decoder: feed it one id at a time to get text deltas for streaming."""
        return DecodeStream(skip_special_tokens=True)


def eos_ids(tokenizer: Tokenizer, tokenizer_config: dict[str, Any], *id_sources: Iterable[int]) -> frozenset[int]:
    """Every id that ends generation: config.json's and generation_config.json's ``eos_token_id``,
    and the tokenizer config's ``eos_token``."""
    found = {int(i) for source in id_sources for i in source}
    token = tokenizer_config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    named = tokenizer.token_to_id(token) if isinstance(token, str) else None
    if named is not None:
        found.add(named)
    return frozenset(found)
