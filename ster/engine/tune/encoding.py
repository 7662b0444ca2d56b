"""Token ids of training data under the chat-template decision.

Two renderings, kept apart from the steering reads (which render a pair side as a
user turn):

* a supervised example is rendered twice under a template — the prompt alone with the
  marker that opens the assistant's turn, then the whole conversation — and the
  completion is the difference, its turn's end marker included; neither half gets the
  tokenizer's own special tokens. A text prompt is one user turn; a conversational
  prompt (system, user and earlier assistant turns) is rendered turn by turn as it is,
  so a multi-turn example trains only on its last answer. Without a template the prompt
  is encoded as raw text (special tokens as the tokenizer adds them) and the completion
  without special tokens;
* a preference side without a prompt is rendered as an assistant turn alone (raw text
  without a template); a side with a prompt is split exactly as an example is, the side
  taking the completion's place, so the prompt's ids are the same for both sides.

Raw text of a conversational prompt: its turns' contents joined by newlines, without
role names (a model without a template has no convention for them), so a conversation
of one user turn encodes exactly as the same prompt given as text, in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ster.engine.model.codec import TextCodec
from ster.engine.protocol.errors import Refusal
from ster.engine.tune.data import Example, Prompt

if TYPE_CHECKING:
    from ster.engine.protocol.jobs import JobContext


@dataclass(frozen=True)
class Sequence:
    """One training row: its ids and where the scored part starts."""

    ids: list[int]
    boundary: int
    """Index of the first token after the prompt: the completion's (sft), or the side's (1 without a prompt)."""


def _turns(prompt: Prompt) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _raw(prompt: Prompt) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(turn["content"] for turn in prompt)


def prompt_and_answer(codec: TextCodec, prompt: Prompt, answer: str) -> tuple[list[int], list[int]]:
    """Ids of the prompt (with the assistant's opening marker) and of the answer after it."""
    return codec.encode_answer(_turns(prompt), _raw(prompt), answer)


def encode_example(codec: TextCodec, example: Example) -> Sequence:
    """Prompt and completion ids of a supervised example, and the boundary between them."""
    if not example.completion.strip():
        raise Refusal("training example has an empty completion")
    prompt_ids, completion_ids = prompt_and_answer(codec, example.prompt, example.completion)
    if not completion_ids:
        raise Refusal("training example completion produced no tokens")
    ids = prompt_ids + completion_ids
    if len(ids) < 2 or not prompt_ids:
        raise Refusal("training example encodes to fewer than two tokens, so there is nothing to predict")
    return Sequence(ids, len(prompt_ids))


def side_sequence(codec: TextCodec, side: str, prompt: Prompt | None = None) -> Sequence:
    """Ids of one side of a preference pair, and where the side begins after its prompt (1 without one)."""
    if prompt is not None:
        prompt_ids, side_ids = prompt_and_answer(codec, prompt, side)
        return Sequence(prompt_ids + side_ids, max(len(prompt_ids), 1))
    tokenizer = codec.tokenizer
    if codec.template is None:
        return Sequence(tokenizer.encode(side).ids, 1)
    text = codec.template.render([{"role": "assistant", "content": side}], add_generation_prompt=False)
    return Sequence(tokenizer.encode(text, add_special_tokens=False).ids, 1)


def encode_side(codec: TextCodec, side: str, prompt: Prompt | None = None) -> list[int]:
    """Ids of one side of a preference pair: an assistant turn under a template, raw text otherwise."""
    return side_sequence(codec, side, prompt).ids


def within_limit(lengths: list[int], limit: int, unit: str, purpose: str, ctx: JobContext, new: int = 0) -> list[int]:
    """Indices of the units whose longest encoded row (``lengths``), with ``new`` tokens still to generate, fits
    ``limit``; each one over it is skipped with a line, never cut, and a set with none left is refused."""
    usable = []
    for index, length in enumerate(lengths):
        if length + new > limit:
            tokens = f"{length} tokens and {new} new tokens" if new else f"{length} tokens"
            ctx.progress("skip", f"skipping {unit} {index + 1}: {tokens} exceed the {limit} token limit")
        else:
            usable.append(index)
    if not usable:
        raise Refusal(f"every {unit} is longer than the sequence limit, so there is nothing to {purpose}")
    return usable
