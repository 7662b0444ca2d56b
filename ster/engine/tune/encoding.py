"""Token ids of training data under the chat-template decision.

Two renderings, kept apart from the steering reads (which render a pair side as a
user turn):

* a supervised example is rendered twice under a template — the prompt alone with the
  marker that opens the assistant's turn, then the whole conversation — and the
  completion is the difference, its turn's end marker included; neither half gets the
  tokenizer's own special tokens. Without a template the prompt is encoded as raw text
  (special tokens as the tokenizer adds them) and the completion without special tokens;
* a preference side is rendered as an assistant turn (after the pair's prompt as a user
  turn, when the data has one); without a template it is raw text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ster.engine.model.codec import TextCodec
from ster.engine.protocol.errors import Refusal
from ster.engine.tune.data import Example, Message


@dataclass(frozen=True)
class Sequence:
    """One training row: its ids and where the scored part starts."""

    ids: list[int]
    boundary: int
    """Index of the first scored token: the completion's first token (sft), 1 for a whole side (dpo)."""


def _turns(prompt: str | list[Message]) -> list[Message]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _raw(prompt: str | list[Message]) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(m.get("content", "") for m in prompt)


def encode_example(codec: TextCodec, example: Example) -> Sequence:
    """Prompt and completion ids of a supervised example, and the boundary between them."""
    if not example.completion.strip():
        raise Refusal("training example has an empty completion")
    tokenizer = codec.tokenizer
    if codec.template is not None:
        turns = _turns(example.prompt)
        head = codec.template.render(turns, add_generation_prompt=True)
        whole = codec.template.render([*turns, {"role": "assistant", "content": example.completion}],
                                      add_generation_prompt=False)
        if not whole.startswith(head):
            raise Refusal("the chat template renders the conversation with a different beginning than the prompt "
                          "alone, so the completion cannot be told apart from the prompt")
        prompt_ids = tokenizer.encode(head, add_special_tokens=False).ids
        completion_ids = tokenizer.encode(whole[len(head):], add_special_tokens=False).ids
    else:
        prompt_ids = tokenizer.encode(_raw(example.prompt)).ids
        completion_ids = tokenizer.encode(example.completion, add_special_tokens=False).ids
    if not completion_ids:
        raise Refusal("training example completion produced no tokens")
    ids = prompt_ids + completion_ids
    if len(ids) < 2 or not prompt_ids:
        raise Refusal("training example encodes to fewer than two tokens, so there is nothing to predict")
    return Sequence(ids, len(prompt_ids))


def encode_side(codec: TextCodec, side: str, prompt: str | list[Message] | None = None) -> list[int]:
    """Ids of one side of a preference pair: an assistant turn under a template, raw text otherwise."""
    tokenizer = codec.tokenizer
    if codec.template is not None:
        turns = _turns(prompt) if prompt is not None else []
        text = codec.template.render([*turns, {"role": "assistant", "content": side}], add_generation_prompt=False)
        return tokenizer.encode(text, add_special_tokens=False).ids
    if prompt is None:
        return tokenizer.encode(side).ids
    return tokenizer.encode(_raw(prompt)).ids + tokenizer.encode(side, add_special_tokens=False).ids
