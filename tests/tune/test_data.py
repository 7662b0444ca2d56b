"""Data as users already have it: JSON Lines in TRL's column names, read beside the original's documents.

Every JSON Lines form is checked against the JSON document that says the same thing, every
refusal names the file, the line and the field, and the toy runs give the same report from
either form of the same data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.model.loading import ModelStore
from ster.engine.model.resolve import EXAMPLES_DIR
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.requests import GenerateRequest
from ster.engine.tune.data import Example, Preference, load_examples, load_preferences, load_prompts
from ster.engine.tune.encoding import encode_example, encode_side, side_sequence

EXAMPLES = json.loads((EXAMPLES_DIR / "examples.json").read_text())["examples"]
PAIRS = json.loads((EXAMPLES_DIR / "pairs.json").read_text())["pairs"]
ANSWER = " answer :"


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def jsonl(path: Path, records: list[dict], prefix: str = "") -> Path:
    path.write_text(prefix + "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def split(pair: dict[str, str]) -> tuple[str, str, str]:
    """A toy pair side 'question : … answer : …' as its prompt and the two answers after it."""
    head, chosen = pair["positive"].split(ANSWER + " ")
    other, rejected = pair["negative"].split(ANSWER + " ")
    assert head == other
    return head + ANSWER, chosen, rejected


def codec(model: str, chat_template: str = "auto"):
    request = GenerateRequest(model=model, prompt="x", chat_template=chat_template)
    return ModelStore().open(request, JobContext(lambda event: None)).codec


# --- examples ---------------------------------------------------------------------------------------------------


def test_prompt_completion_lines_read_as_the_example_document(tmp_path: Path) -> None:
    document = load_examples(EXAMPLES_DIR / "examples.json")
    lines = load_examples(jsonl(tmp_path / "examples.jsonl", EXAMPLES))
    assert lines.examples == document.examples
    assert (lines.label, lines.name) == (str(tmp_path / "examples.jsonl"), None)


def test_the_content_decides_not_the_suffix(tmp_path: Path) -> None:
    """JSON Lines named .json, with a byte-order mark, CRLF endings, blank lines and extra columns, still read."""
    records = [{**e, "id": i, "source": "toy"} for i, e in enumerate(EXAMPLES)]
    path = tmp_path / "examples.json"
    path.write_bytes(b"\xef\xbb\xbf\r\n" + b"\r\n\r\n".join(json.dumps(r).encode() for r in records) + b"\r\n")
    assert load_examples(path).examples == load_examples(EXAMPLES_DIR / "examples.json").examples
    single = tmp_path / "one.json"
    single.write_text(json.dumps(EXAMPLES[0], indent=2))
    assert load_examples(single).examples == [Example(EXAMPLES[0]["prompt"], EXAMPLES[0]["completion"])]


def test_conversations_split_at_their_last_assistant_turn(tmp_path: Path) -> None:
    turns = [{"role": "system", "content": "be brief"}, user("a cat ?"), assistant("four ."), user("a bird ?")]
    records = [
        {"messages": [*turns, assistant("two .")]},
        {"prompt": turns, "completion": [assistant("two .")]},  # TRL's conversational prompt/completion
        {"prompt": turns, "completion": "two ."},
    ]
    examples = load_examples(jsonl(tmp_path / "chat.jsonl", records)).examples
    assert examples == [Example(turns, "two .")] * 3


def test_an_ultrachat_row_trains_on_its_messages(tmp_path: Path) -> None:
    """A dataset that keeps a text prompt beside its conversation (UltraChat) is read by the conversation."""
    record = {"prompt": "a cat ?", "prompt_id": "x1", "messages": [user("a cat ?"), assistant("four .")]}
    assert load_examples(jsonl(tmp_path / "u.jsonl", [record])).examples == [Example([user("a cat ?")], "four .")]


# --- preference pairs -------------------------------------------------------------------------------------------


def test_chosen_rejected_lines_read_as_the_pair_set(tmp_path: Path) -> None:
    document = load_preferences(EXAMPLES_DIR / "pairs.json")
    records = [{"chosen": p["positive"], "rejected": p["negative"]} for p in PAIRS]
    lines = load_preferences(jsonl(tmp_path / "pairs.jsonl", records))
    assert lines.pairs == document.pairs
    assert document.pairs[0] == Preference(PAIRS[0]["positive"], PAIRS[0]["negative"], None)


def test_the_workspace_set_is_read_when_no_path_is_given(cli) -> None:
    assert cli("workspace", "import-pairs", EXAMPLES_DIR / "pairs.json").code == 0
    assert load_preferences(None).pairs == load_preferences(EXAMPLES_DIR / "pairs.json").pairs


def test_a_prompt_is_shared_by_both_sides(tmp_path: Path) -> None:
    prompt, chosen, rejected = split(PAIRS[0])
    records = [{"prompt": prompt, "chosen": chosen, "rejected": rejected}]
    assert load_preferences(jsonl(tmp_path / "p.jsonl", records)).pairs == [Preference(chosen, rejected, prompt)]


def test_conversational_pairs_share_their_leading_turns_as_the_prompt(tmp_path: Path) -> None:
    turns = [user("a cat ?"), assistant("four ."), user("and the sea ?")]
    expected = Preference("calm .", "wild .", turns)
    records = [
        {"chosen": [*turns, assistant("calm .")], "rejected": [*turns, assistant("wild .")]},  # implicit prompt
        {"prompt": turns, "chosen": [assistant("calm .")], "rejected": [assistant("wild .")]},  # explicit
        {
            "prompt": "a cat ?",
            "chosen": [*turns, assistant("calm .")],  # UltraFeedback: the text repeats turn 1
            "rejected": [*turns, assistant("wild .")],
            "score_chosen": 8.0,
        },
        {"prompt": turns, "chosen": "calm .", "rejected": "wild ."},
    ]
    assert load_preferences(jsonl(tmp_path / "c.jsonl", records)).pairs == [expected] * 4
    lone = {"prompt": "the sea ?", "chosen": [assistant("calm .")], "rejected": [assistant("wild .")]}
    assert load_preferences(jsonl(tmp_path / "l.jsonl", [lone])).pairs == [Preference("calm .", "wild .", "the sea ?")]
    bare = {"chosen": [assistant("calm .")], "rejected": [assistant("wild .")]}
    assert load_preferences(jsonl(tmp_path / "b.jsonl", [bare])).pairs == [Preference("calm .", "wild .", None)]


# --- prompts ----------------------------------------------------------------------------------------------------


def test_prompt_lines_read_as_the_prompt_set(tmp_path: Path) -> None:
    document = load_prompts(EXAMPLES_DIR / "grpo-prompts.json")
    assert all(isinstance(p, str) for p in document)
    assert load_prompts(jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in document])) == document
    conversation = [user("a cat ?"), assistant("four ."), user("a bird ?")]
    records = [
        {"messages": conversation},
        {"messages": [*conversation, assistant("two .")]},
        {"prompt": "a cat ?", "completion": "four ."},
    ]
    assert load_prompts(jsonl(tmp_path / "m.jsonl", records)) == [conversation, conversation, "a cat ?"]


# --- refusals ---------------------------------------------------------------------------------------------------

EXAMPLE_REFUSALS = [
    (
        '{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": 3}\n',
        '{f} line 3: "completion" must be text or a list of messages',
    ),
    (
        '{"prompt": "a", "completion": "b"}\n\n\n{"prompt": "a", "completion": "b",}\n',
        "{f} line 4 is not valid JSON: Expecting property name enclosed in double quotes at column 35",
    ),
    ('{"prompt": "a", "completion": "b"}\n{"text": "a b"}\n', "{f} line 2 has neither prompt/completion nor messages"),
    ('{"prompt": "a"}\n', '{f} line 1 has a "prompt" but no "completion"'),
    ('{"completion": "a"}\n', '{f} line 1 has a "completion" but no "prompt"'),
    (
        '{"prompt": "a", "prompt": "b", "completion": "c"}\n',
        '{f} line 1 gives the key "prompt" twice, so which value is meant is ambiguous',
    ),
    ('["a", "b"]\n', "{f} line 1 is not a JSON object"),
    (
        '{"messages": [{"role": "user", "content": "a"}]}\n',
        '{f} line 1: "messages" must end with an assistant turn, the completion to learn',
    ),
    ('{"messages": "a"}\n', '{f} line 1: "messages" must be a list of messages'),
    (
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}\n',
        '{f} line 1: message 1 of "messages" needs a text "role" and a text "content"',
    ),
    (
        '{"prompt": "a", "completion": [{"role": "user", "content": "b"}]}\n',
        '{f} line 1: "completion" must be text or a list of one assistant turn',
    ),
    ('{"prompt": 1, "completion": "b"}\n', '{f} line 1: "prompt" must be text or a list of messages'),
    ("", "example set {f} contains no examples"),
    ("\n  \n", "example set {f} contains no examples"),
    (
        '{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "  "}\n',
        "example set {f} contains an empty prompt or completion at line 2",
    ),
    (
        '{"messages": [{"role": "assistant", "content": "b"}]}\n',
        "example set {f} contains an empty prompt or completion at line 1",
    ),
]

PAIR_REFUSALS = [
    ('{"chosen": "a", "rejected": "b"}\n{"prompt": "a"}\n', "{f} line 2 has neither chosen nor rejected"),
    ('{"prompt": "p", "chosen": "a"}\n', '{f} line 1 has no "rejected"'),
    ('{"chosen": "a", "rejected": 2}\n', '{f} line 1: "rejected" must be text or a list of messages'),
    (
        '{"chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}\n',
        '{f} line 1: "chosen" and "rejected" must both be text or both lists of messages',
    ),
    (
        (
            '{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], '
            '"rejected": [{"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]}\n'
        ),
        '{f} line 1: "chosen" must end in one assistant turn after the turns both sides share',
    ),
    (
        '{"chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "b"}]}\n',
        '{f} line 1: "rejected" must end in one assistant turn after the turns both sides share',
    ),
    ("", "pair set {f} contains no pairs"),
    (
        '{"chosen": "a", "rejected": "b"}\n{"chosen": "a", "rejected": ""}\n',
        "pair set {f} contains an empty positive or negative prompt at line 2",
    ),
    (
        '{"prompt": " ", "chosen": "a", "rejected": "b"}\n',
        'pair set {f} has an empty "prompt" at line 1; leave the field out for a pair without one',
    ),
]

PROMPT_REFUSALS = [
    ('{"prompt": "a"}\n{"completion": "b"}\n', "{f} line 2 has neither prompt nor messages"),
    ('{"prompt": "a"}\n{"prompt": ""}\n', "prompt set {f} contains an empty prompt at line 2"),
    ("", "prompt set {f} contains no prompts"),
]


@pytest.mark.parametrize(
    ("loader", "text", "sentence"),
    [(load_examples, *case) for case in EXAMPLE_REFUSALS]
    + [(load_preferences, *case) for case in PAIR_REFUSALS]
    + [(load_prompts, *case) for case in PROMPT_REFUSALS],
)
def test_a_line_that_does_not_fit_is_refused_naming_it(tmp_path: Path, loader, text: str, sentence: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(Refusal) as caught:
        loader(path)
    assert str(caught.value) == sentence.format(f=path)


def test_documents_keep_their_own_sentences(tmp_path: Path) -> None:
    """A malformed document is refused as a document, not as a broken first line of JSON Lines."""
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "examples": [\n    {"prompt": "a", "completion": "b"},\n  ]\n}\n')
    with pytest.raises(Refusal, match=r"^example set .*broken.json is not valid JSON: .* at line 4 column 3$"):
        load_examples(broken)
    twice = tmp_path / "twice.json"
    twice.write_text('{"examples": [], "examples": []}')
    with pytest.raises(Refusal, match='gives the key "examples" twice in one object'):
        load_examples(twice)
    empty = tmp_path / "empty.json"
    empty.write_text('{"name": "x", "examples": []}')
    with pytest.raises(Refusal, match=r"^example set .*empty.json contains no examples$"):
        load_examples(empty)
    with pytest.raises(Refusal, match=r"is an example set, not a pair set$"):
        load_preferences(EXAMPLES_DIR / "examples.json")


# --- encoding ---------------------------------------------------------------------------------------------------


def test_a_templated_completion_carries_one_more_token_the_turns_end() -> None:
    """The contract's toy check: on ster:toy-chat each completion gains exactly the assistant turn's </s>."""
    templated, raw = codec("ster:toy-chat"), codec("ster:toy-chat", "off")
    assert (templated.decision, raw.decision) == ("applied", "off")
    end = templated.tokenizer.token_to_id("</s>")
    for example in load_examples(EXAMPLES_DIR / "chat-examples.json").examples:
        with_template, without = encode_example(templated, example), encode_example(raw, example)
        tail = with_template.ids[with_template.boundary :]
        assert len(tail) == len(without.ids) - without.boundary + 1
        assert tail[-1] == end and tail[:-1] == without.ids[without.boundary :]


def test_a_conversation_is_rendered_twice_and_split_at_its_last_answer() -> None:
    templated = codec("ster:toy-chat")
    turns = [user("how many legs does a cat have ?"), assistant("four ."), user("and a bird ?")]
    sequence = encode_example(templated, Example(turns, "two ."))
    text = templated.template.render([*turns, assistant("two .")], add_generation_prompt=False)
    assert sequence.ids == templated.tokenizer.encode(text, add_special_tokens=False).ids
    head = templated.template.render(turns, add_generation_prompt=True)
    assert sequence.boundary == len(templated.tokenizer.encode(head, add_special_tokens=False).ids)
    assert templated.tokenizer.decode(sequence.ids[sequence.boundary :], skip_special_tokens=False) == "two. </s>"
    raw = encode_example(codec("ster:toy-chat", "off"), Example(turns, "two ."))
    expected = codec("ster:toy").tokenizer.encode("how many legs does a cat have ?\nfour .\nand a bird ? two .").ids
    assert raw.ids == expected


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_one_user_turn_encodes_as_its_text(mode: str) -> None:
    chat = codec("ster:toy-chat", mode)
    text = Example("what color is the grass ?", "the grass is green .")
    turn = Example([user("what color is the grass ?")], "the grass is green .")
    assert encode_example(chat, turn) == encode_example(chat, text)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_prompted_side_is_split_as_an_example(mode: str) -> None:
    chat = codec("ster:toy-chat", mode)
    for prompt in ("how is the sea today ?", [user("how is the sea today ?")]):
        side = side_sequence(chat, "the sea is calm .", prompt)
        assert side == encode_example(chat, Example(prompt, "the sea is calm ."))
        assert encode_side(chat, "the sea is calm .", prompt) == side.ids
    assert side_sequence(chat, "the sea is calm .").boundary == 1


def test_a_raw_prompted_side_is_the_document_side_on_the_toy() -> None:
    """Without a template the toy splits at spaces, so prompt + side is the pair set's whole side."""
    toy = codec("ster:toy")
    for pair in PAIRS:
        prompt, chosen, rejected = split(pair)
        assert encode_side(toy, chosen, prompt) == encode_side(toy, pair["positive"])
        assert encode_side(toy, rejected, prompt) == encode_side(toy, pair["negative"])


# --- end to end -------------------------------------------------------------------------------------------------


def test_tune_sft_reads_json_lines_as_the_document(cli, tmp_path: Path) -> None:
    document = tmp_path / "examples.json"
    document.write_text(json.dumps({"examples": EXAMPLES[:4]}))
    lines = jsonl(tmp_path / "examples.jsonl", EXAMPLES[:4])
    runs = [
        cli(
            "tune",
            "sft",
            "--model",
            "ster:toy",
            "--examples",
            path,
            "--output",
            tmp_path / f"adapter-{path.suffix[1:]}.safetensors",
            "--accumulation",
            "2",
        )
        for path in (document, lines)
    ]
    assert [run.code for run in runs] == [0, 0], runs[1].err
    assert runs[1].json["report"] == runs[0].json["report"]
    assert runs[1].json["report"]["examples"] == 4


def test_tune_dpo_reads_prompted_json_lines_as_the_pair_set(cli, tmp_path: Path) -> None:
    document = tmp_path / "pairs.json"
    document.write_text(json.dumps({"trait_name": "calm", "pairs": PAIRS[:4]}))
    records = [dict(zip(("prompt", "chosen", "rejected"), split(pair))) for pair in PAIRS[:4]]
    lines = jsonl(tmp_path / "pairs.jsonl", records)
    runs = [
        cli(
            "tune",
            "dpo",
            "--model",
            "ster:toy",
            "--pairs",
            path,
            "--output",
            tmp_path / f"adapter-{path.suffix[1:]}.safetensors",
            "--accumulation",
            "2",
        )
        for path in (document, lines)
    ]
    assert [run.code for run in runs] == [0, 0], runs[1].err
    whole, prompted = (run.json["report"] for run in runs)
    # The prompt is scored in neither side's reward when the data names it, but it cancels from the margin,
    # so the loss, the accuracy and the margin are those of the pair set.
    for field in ("first_loss", "final_loss", "mean_final_epoch_loss", "accuracy", "mean_reward_margin"):
        assert prompted[field] == pytest.approx(whole[field], rel=1e-4, abs=1e-6), field
    assert prompted["pairs"] == 4
