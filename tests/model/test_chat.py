"""Chat templates: rendering, the three decisions, and the refusals that name a template line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ster.engine.model.chat import DECISION_SENTENCES, ChatTemplate, decide, find_template
from ster.engine.model.toy import TEMPLATE
from ster.engine.protocol.errors import Refusal


def render(source: str, special: dict[str, str] | None = None) -> str:
    return ChatTemplate.compile(source, special or {}).render_prompt("hello")


def test_the_toy_template_renders_a_user_turn_and_the_answer_marker() -> None:
    assert render(TEMPLATE, {"bos_token": "<s>"}) == "<s>question : hello answer :"
    conversation = [{"role": "user", "content": "hi ?"}, {"role": "assistant", "content": "yes ."}]
    rendered = ChatTemplate.compile(TEMPLATE, {"bos_token": "<s>"}).render(conversation, add_generation_prompt=False)
    assert rendered == "<s>question : hi ? answer : yes . </s> "


def test_decisions() -> None:
    assert decide("auto", "x") == "applied"
    assert decide("auto", None) == "absent"
    assert decide("off", "x") == "off"
    assert set(DECISION_SENTENCES) == {"applied", "absent", "off"}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "line one\n{{ nothing_here }}",
            "the chat template uses something undefined: 'nothing_here' is undefined (template line 2)",
        ),
        (
            "a\nb\n{{ raise_exception('no system turns') }}",
            "the chat template failed: no system turns (template line 3)",
        ),
        (
            "{% for m in messages %}\n{{ m.missing }}{% endfor %}",
            "the chat template uses something undefined: 'dict object' has no attribute 'missing' (template line 2)",
        ),
        ("{% if %}", "the chat template does not parse"),
    ],
)
def test_template_failures_name_the_line(source: str, message: str) -> None:
    with pytest.raises(Refusal) as caught:
        render(source)
    assert str(caught.value).startswith(message)


def test_a_template_that_writes_an_undeclared_bos_token_is_refused() -> None:
    with pytest.raises(
        Refusal, match="writes bos_token \\(template line 1\\), but the tokenizer config declares no bos_token"
    ):
        render("{{ bos_token }}{{ messages[0]['content'] }}")


def test_testing_an_undefined_value_is_allowed() -> None:
    source = (
        "{% if system is defined %}S{% endif %}{% if messages[0].get('name') %}N{% endif %}{{ messages[0]['content'] }}"
    )
    assert render(source) == "hello"


def test_huggingface_globals_and_methods() -> None:
    source = "{{ strftime_now('%Y') | length }} {{ messages[0]['content'].upper() }} {{ messages | tojson }}"
    assert render(source) == '4 HELLO [{"role": "user", "content": "hello"}]'


def test_where_templates_are_found(tmp_path: Path) -> None:
    assert find_template({"chat_template": "A"}, None) == "A"
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert find_template({"chat_template": named}, None) == "D"
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text("J")
    assert find_template({}, jinja) == "J"
    assert find_template({}, None) is None


def test_a_broken_template_refuses_before_any_weight_loads(cli, tmp_path: Path, toy_copy: Path) -> None:
    config = {"bos_token": "<s>", "chat_template": "{{ bos_token }}\n{{ undefined_thing }}"}
    (toy_copy / "tokenizer_config.json").write_text(json.dumps(config))
    (toy_copy / "model.safetensors").write_bytes(b"never read")
    run = cli("generate", "--model", toy_copy, "--prompt", "hi")
    assert run.code == 1
    assert "'undefined_thing' is undefined (template line 2)" in run.err
    # off never renders it, so the run gets as far as the (broken) weights
    off = cli("generate", "--model", toy_copy, "--prompt", "hi", "--chat-template", "off")
    assert off.code == 1 and "undefined_thing" not in off.err
    assert f"weights file {toy_copy / 'model.safetensors'} could not be read" in off.err
