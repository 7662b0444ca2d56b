"""An offline judge: a local instruct model asked a yes/no question about a text, read as p(yes) from its logits.

The question names the pair set's trait (``QUESTION``; ``--judge-question`` replaces it, with ``{text}`` where
the text goes and ``{trait}`` optional). It is asked as a user turn under the judge's chat template, and the
answer is read at the first position of the judge's reply, without sampling: p(yes) is the probability of
the yes tokens against the no tokens (" yes", "Yes" and their kin, each word's first token), so a judge that
would rather say something else still gives a number between 0 and 1. It measures what the text says, not
how the direction reads it. Nothing here imports torch until a text is judged.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.naming import flag

if TYPE_CHECKING:
    from ster.engine.model.codec import TextCodec
    from ster.engine.model.contract import Decoder

QUESTION = 'Here is a reply someone wrote:\n\n"{text}"\n\nIs this reply {trait}? Answer with yes or no.'
YES = ("yes", "Yes", " yes", " Yes", "YES")
NO = ("no", "No", " no", " No", "NO")


def question_for(trait: str, template: str | None) -> str:
    """The question template, checked: it must say where the text goes, and name a trait when it has none."""
    chosen = template or QUESTION
    if "{text}" not in chosen:
        raise Refusal(f"{flag('judge_question')} must hold {{text}}, where the judged text goes")
    if "{trait}" in chosen and not trait.strip():
        raise Refusal(
            f"the pair set names no trait for the judge's question; give {flag('judge_question')} with the trait written out"
        )
    return chosen


def _first_ids(codec: TextCodec, words: tuple[str, ...]) -> set[int]:
    ids = set()
    for word in words:
        encoded = codec.tokenizer.encode(word, add_special_tokens=False).ids
        if encoded:
            ids.add(encoded[0])
    return ids


def judge_texts(model: Decoder, codec: TextCodec, texts: list[str], trait: str, template: str) -> list[float]:
    """The judge's p(yes) for each text (an empty text is judged as it is)."""
    import torch

    yes, no = _first_ids(codec, YES), _first_ids(codec, NO)
    yes, no = yes - no, no - yes
    if not yes or not no:
        raise Refusal("the judge's tokenizer does not tell yes from no, so it cannot answer the question")
    yes_ids, no_ids = torch.tensor(sorted(yes)), torch.tensor(sorted(no))
    device = model.lm_head.weight.device
    scores = []
    with torch.inference_mode():
        for text in texts:
            prompt = template.replace("{trait}", trait).replace("{text}", text.strip())
            ids = codec.encode_prompt(prompt)
            logits = model(torch.tensor([ids], device=device), vocab="last").require_logits()[0].float().cpu()
            gap = float(torch.logsumexp(logits[yes_ids], 0) - torch.logsumexp(logits[no_ids], 0))
            scores.append(1.0 / (1.0 + math.exp(-gap)) if gap >= 0 else math.exp(gap) / (1.0 + math.exp(gap)))
    return scores
