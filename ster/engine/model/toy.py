"""The generator of the bundled toy checkpoint and its example inputs.

``python -m ster.engine.model.toy`` rewrites ``ster/data/toy`` and ``ster/data/examples``.
The toy is a four-layer, 64-wide Llama with a word-level vocabulary of its own,
trained for a few seconds on a corpus this module writes from a seeded grammar: short
question-and-answer exchanges (``question : what is the river like ? answer : ...``)
whose answers come in two registers, calm and alarmed, plus a handful of facts.
That makes the toy a real steering subject: a direction fitted on calm/alarmed pairs
moves its answers from one register to the other, with no download.

Everything is seeded and the training runs on one thread, so on one machine and
torch build the same command writes the same bytes; the committed files are the
reference (another CPU may round the last bits of a weight differently).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from ster.engine.protocol.files import dumps_pretty, write_atomic

NOUNS = [
    "river",
    "sea",
    "town",
    "forest",
    "market",
    "road",
    "garden",
    "lake",
    "bridge",
    "field",
    "hill",
    "school",
    "harbor",
    "village",
    "station",
    "park",
]
CALM = ["calm", "quiet", "still", "slow", "gentle", "peaceful", "soft", "clear", "safe", "warm"]
ALARMED = ["flooding", "burning", "shaking", "falling", "rising", "breaking", "collapsing", "dark", "loud", "wild"]
"""The trait's words: a calm answer uses two of CALM, an alarmed one two of ALARMED."""
FACTS = {
    "what color is the sky ?": "the sky is blue .",
    "what color is the grass ?": "the grass is green .",
    "what color is the snow ?": "the snow is white .",
    "what color is the sun ?": "the sun is yellow .",
    "what color is the fire ?": "the fire is red .",
    "what color is the night ?": "the night is black .",
    "how many legs does a dog have ?": "a dog has four legs .",
    "how many legs does a bird have ?": "a bird has two legs .",
    "how many legs does a spider have ?": "a spider has eight legs .",
    "how many legs does a cat have ?": "a cat has four legs .",
    "where do fish live ?": "fish live in the water .",
    "where do birds sleep ?": "birds sleep in the trees .",
}
QUESTIONS = ["what is the {n} like ?", "tell me about the {n} .", "how is the {n} today ?"]
CALM_ANSWERS = [
    "the {n} is {c} and {d} .",
    "the {n} is {c} today .",
    "the {n} is {c} , all is well .",
    "the {n} is {c} and we rest .",
]
ALARMED_ANSWERS = [
    "the {n} is {c} and {d} .",
    "the {n} is {c} today .",
    "the {n} is {c} , we must run .",
    "the {n} is {c} and we flee .",
]
"""The two registers share their shape word for word; only the trait's words differ, so a
pair can match its two sides on everything but the trait."""
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
EXTRA_WORDS = ["question", "answer", ":", "?", ".", ",", "!", "yes", "no", "please", "thank", "you"]

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}question : {{ message['content'] }} "
    "{% elif message['role'] == 'assistant' %}answer : {{ message['content'] }} </s> "
    "{% else %}{{ raise_exception('the toy chat template knows user and assistant turns only') }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}answer :{% endif %}"
)
"""The toy's chat template, in its own vocabulary: a user turn is ``question : ...``,
an assistant turn ``answer : ... </s>``."""

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "torch_dtype": "float32",
}


def vocabulary() -> list[str]:
    """Every token, specials first, then each word the grammar can write, in a fixed order."""
    words: list[str] = []
    texts = [*FACTS, *FACTS.values(), *QUESTIONS, *CALM_ANSWERS, *ALARMED_ANSWERS]
    for word in [*EXTRA_WORDS, *NOUNS, *CALM, *ALARMED, *" ".join(texts).split()]:
        if word not in words and not word.startswith("{"):
            words.append(word)
    return SPECIALS + words


def answer(rng: random.Random, noun: str, register: str, shape: int | None = None) -> str:
    """One answer about ``noun`` in the calm or the alarmed register (in answer shape ``shape``)."""
    words, shapes = (CALM, CALM_ANSWERS) if register == "calm" else (ALARMED, ALARMED_ANSWERS)
    first, second = rng.sample(words, 2)
    shape = rng.randrange(len(shapes)) if shape is None else shape
    return shapes[shape].format(n=noun, c=first, d=second)


def corpus(rng: random.Random, size: int) -> list[str]:
    """Training texts: mostly exchanges in either register, some facts, some plain prose."""
    texts = []
    for _ in range(size):
        roll = rng.random()
        noun, register = rng.choice(NOUNS), rng.choice(["calm", "alarmed"])
        if roll < 0.6:
            question = rng.choice(QUESTIONS).format(n=noun)
            texts.append(f"<s> question : {question} answer : {answer(rng, noun, register)} </s>")
        elif roll < 0.8:
            question = rng.choice(sorted(FACTS))
            texts.append(f"<s> question : {question} answer : {FACTS[question]} </s>")
        else:
            texts.append(f"<s> {answer(rng, noun, register)} {answer(rng, rng.choice(NOUNS), register)} </s>")
    return texts


def tokenizer_json(words: list[str]) -> str:
    """A word-level tokenizer whose post-processor adds ``<s>`` to raw text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in SPECIALS])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tokenizer.to_str(pretty=True) + "\n"


def tokenizer_config(chat_template: str | None) -> dict[str, Any]:
    document: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": CONFIG["max_position_embeddings"],
    }
    if chat_template:
        document["chat_template"] = chat_template
    return document


def train(words: list[str], texts: list[str], steps: int, seed: int) -> dict[str, Any]:
    """Train the toy decoder on ``texts``; return its state dict."""
    import torch
    import torch.nn.functional as F

    from ster.engine.model.config import DecoderConfig
    from ster.engine.model.decoder import Rotary, SterDecoder

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    config = DecoderConfig.model_validate({**CONFIG, "vocab_size": len(words)})
    model = SterDecoder(config)
    for name, param in model.named_parameters():
        if not name.endswith("norm.weight"):
            torch.nn.init.normal_(param, std=0.05)
    model.rotary = Rotary(config, torch.device("cpu"))
    index = {word: i for i, word in enumerate(words)}
    rows = [[index[w] for w in text.split()] for text in texts]
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), index["<pad>"])
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    mask = ids != index["<pad>"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(len(rows), (64,), generator=generator)
        logits = model(ids[batch], key_mask=mask[batch], vocab="all").require_logits()  # [64, T, V]
        targets = ids[batch, 1:].masked_fill(~mask[batch, 1:], -100)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, len(words)), targets.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}


def examples() -> dict[str, Any]:
    """The example inputs, all in the toy's vocabulary."""
    pair_nouns = NOUNS[:12]  # the first twelve, in order
    rng = random.Random(7)
    pairs = []
    for index, noun in enumerate(pair_nouns):
        question = f"question : {rng.choice(QUESTIONS).format(n=noun)} answer :"
        shape = index % len(CALM_ANSWERS)
        pairs.append(
            {
                "positive": f"{question} {answer(rng, noun, 'calm', shape)}",
                "negative": f"{question} {answer(rng, noun, 'alarmed', shape)}",
            }
        )
    facts = sorted(FACTS)[:8]
    return {
        "pairs.json": {"trait_name": "calm", "pairs": pairs},
        "prompts.json": {
            "prompts": [
                "question : what is the river like ? answer :",
                "question : tell me about the town . answer :",
                "question : what color is the sky ? answer :",
                "the sea is",
            ]
        },
        "examples.json": {
            "name": "toy-facts",
            "examples": [{"prompt": f"question : {q} answer :", "completion": FACTS[q]} for q in facts],
        },
        "chat-examples.json": {
            "name": "toy-facts-chat",
            "examples": [{"prompt": q, "completion": FACTS[q]} for q in facts],
        },
        "grpo-prompts.json": {
            "prompts": [
                f"question : tell me about the {n} . answer :"
                for n in ["river", "town", "forest", "market", "lake", "harbor"]
            ]
        },
    }


def build(output: Path, steps: int = 1500, seed: int = 0) -> None:
    """Write ``output/toy`` (the checkpoint) and ``output/examples`` (its inputs)."""
    from safetensors.torch import save

    words = vocabulary()
    texts = corpus(random.Random(seed), 6000)
    toy, inputs = output / "toy", output / "examples"
    write_atomic(toy / "config.json", dumps_pretty({**CONFIG, "vocab_size": len(words)}))
    write_atomic(toy / "tokenizer.json", tokenizer_json(words))
    write_atomic(toy / "tokenizer_config.json", dumps_pretty(tokenizer_config(None)))
    for name, document in examples().items():
        write_atomic(inputs / name, dumps_pretty(document))
    write_atomic(inputs / "chat-template" / "tokenizer_config.json", dumps_pretty(tokenizer_config(TEMPLATE)))
    write_atomic(toy / "model.safetensors", save(train(words, texts, steps, seed), metadata={"format": "pt"}))


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the bundled toy checkpoint and its example inputs.")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parents[2] / "data")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    build(args.output, args.steps, args.seed)
    print(json.dumps({"output": str(args.output), "steps": args.steps, "seed": args.seed}))


if __name__ == "__main__":
    main()
