"""``ster extract``: the read, checked against transformers' own forward, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ster.engine.model.loading import model_store
from ster.engine.model.resolve import TOY_DIR
from ster.engine.protocol.jobs import JobContext
from ster.engine.steering.activations import read_last_states
from ster.engine.steering.requests import ExtractRequest

PROMPTS = [
    "question : what is the river like ? answer :",
    "the sea is",
    "question : how many legs does a spider have ? answer : a spider has",
    "help !",
]


def write_prompts(path: Path, prompts: list[str] = PROMPTS) -> Path:
    path.write_text(json.dumps({"prompts": prompts}))
    return path


def extract(cli, tmp_path: Path, *extra: str, model: str = "ster:toy"):
    out = tmp_path / "states.json"
    run = cli("extract", "--model", model, "--input", write_prompts(tmp_path / "prompts.json"), "--output", out, *extra)
    return run, out


def reference_states(model_dir: Path, prompts: list[str]) -> list[list[torch.Tensor]]:
    """Per prompt, the last token's state after every block, from transformers' LlamaForCausalLM."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    last_block: list[torch.Tensor] = []
    model.model.layers[-1].register_forward_hook(
        lambda m, a, out: last_block.append(out[0] if isinstance(out, tuple) else out)
    )
    states = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states
        # hidden[i + 1] is block i's output, except the last slot, which is after the final norm.
        per_layer = [hidden[i + 1][0, -1] for i in range(len(hidden) - 2)] + [last_block[-1][0, -1]]
        states.append(per_layer)
    return states


def test_states_equal_transformers_hidden_states(cli, tmp_path: Path) -> None:
    run, out = extract(cli, tmp_path)
    assert run.code == 0, run.err
    document = json.loads(out.read_text())
    assert {
        k: document[k]
        for k in ("schema_version", "product", "model", "model_revision", "hidden_size", "precision", "chat_template")
    } == {
        "schema_version": 1,
        "product": "ster",
        "model": "ster:toy",
        "model_revision": None,
        "hidden_size": 64,
        "precision": "f32",
        "chat_template": "absent",
    }
    expected = reference_states(TOY_DIR, PROMPTS)
    assert [r["prompt"] for r in document["records"]] == PROMPTS
    for record, reference in zip(document["records"], expected):
        assert sorted(record["layers"], key=int) == ["0", "1", "2", "3"]
        for layer, values in record["layers"].items():
            assert len(values) == 64
            torch.testing.assert_close(torch.tensor(values), reference[int(layer)], atol=1e-5, rtol=1e-5)
    summary = run.json
    assert summary["prompts"] == 4 and summary["layers"] == [0, 1, 2, 3] and summary["output"] == str(out)


def test_batched_reads_equal_one_at_a_time(cli, tmp_path: Path) -> None:
    one = tmp_path / "one"
    many = tmp_path / "many"
    one.mkdir(), many.mkdir()
    assert extract(cli, one, "--batch-size", "1")[0].code == 0
    assert extract(cli, many, "--batch-size", "4")[0].code == 0
    a = json.loads((one / "states.json").read_text())["records"]
    b = json.loads((many / "states.json").read_text())["records"]
    for x, y in zip(a, b):
        for layer in x["layers"]:
            torch.testing.assert_close(
                torch.tensor(x["layers"][layer]), torch.tensor(y["layers"][layer]), atol=1e-5, rtol=0
            )


@pytest.mark.parametrize(("spec", "layers"), [("1,3", ["1", "3"]), ("1..3", ["1", "2"]), ("2", ["2"])])
def test_layer_selection(cli, tmp_path: Path, spec: str, layers: list[str]) -> None:
    run, out = extract(cli, tmp_path, "--layers", spec)
    assert run.code == 0, run.err
    assert sorted(json.loads(out.read_text())["records"][0]["layers"]) == layers


def test_the_read_stops_after_the_deepest_layer_and_skips_the_vocabulary() -> None:
    ctx = JobContext(lambda event: None)
    request = ExtractRequest(model="ster:toy", input=Path("unused-in"), output=Path("unused-out"))
    checkpoint = model_store(ctx).open(request, ctx)
    model = model_store(ctx).decoder(checkpoint, ctx)

    def forbidden(*args):
        raise AssertionError("this should not run")

    handle = model.blocks[2].register_forward_pre_hook(forbidden)
    original = model._logits
    model._logits = lambda h, vocab: forbidden() if vocab != "none" else None
    try:
        states = read_last_states(model, [[1, 5, 6], [1, 7]], [0, 1], batch_size=2)
    finally:
        handle.remove()
        model._logits = original
    assert states.shape == (2, 2, 64)


@pytest.mark.parametrize(
    ("spec", "sentence"),
    [
        ("7", "layer 7 is out of range: this model has 4 layers, numbered 0..3"),
        ("2..9", "layer 4 is out of range: this model has 4 layers, numbered 0..3"),
        (
            "two",
            "--layers takes all, a comma list such as 2,5, or a half-open range such as 2..6, or a mix such as "
            '1,4..7; got "two"',
        ),
        ("3..1", "layer range 3..1 is empty: a..b selects a up to but not including b"),
    ],
)
def test_bad_layers_are_refused_and_nothing_is_written(cli, tmp_path: Path, spec: str, sentence: str) -> None:
    run, out = extract(cli, tmp_path, "--layers", spec)
    assert run.code == 1
    assert run.err.strip().splitlines()[-1] == f"error: {sentence}"
    assert "Traceback" not in run.err and not out.exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"prompts": []}', "prompts: it contains no prompts"),
        ('{"prompts": ["ok", "  "]}', "prompts: prompt 1 is empty"),
        ('["a"]', "is not in the expected shape"),
    ],
)
def test_bad_input_is_refused(cli, tmp_path: Path, content: str, fragment: str) -> None:
    source = tmp_path / "in.json"
    source.write_text(content)
    out = tmp_path / "out.json"
    run = cli("extract", "--model", "ster:toy", "--input", source, "--output", out)
    assert run.code == 1 and fragment in run.err and not out.exists()


def test_missing_input_is_refused(cli, tmp_path: Path) -> None:
    run = cli("extract", "--model", "ster:toy", "--input", tmp_path / "nope.json", "--output", tmp_path / "o.json")
    assert run.code == 1 and f"input {tmp_path / 'nope.json'} does not exist" in run.err


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        (
            {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
            "declares architectures BertForMaskedLM, which is not a causal language model; Ster reads and steers causal "
            "language models only",
        ),
        (
            {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]},
            'declares model_type "t5", which is not a causal language model',
        ),
        (
            {"model_type": "no_such_family"},
            'declares model_type "no_such_family", which Ster cannot load: it has no decoder for it (natively: "llama", '
            '"qwen2", "mistral", "qwen3", "phi3", "gemma3_text", "gemma3") and transformers does not know it',
        ),
        (
            {"model_type": "gpt2", "auto_map": {"AutoModelForCausalLM": "modeling.Custom"}},
            "needs its own modelling code (auto_map); Ster does not run code a checkpoint ships",
        ),
    ],
)
def test_a_checkpoint_ster_cannot_run_is_refused_before_weights_are_read(
    cli, tmp_path: Path, toy_copy: Path, fields: dict, sentence: str
) -> None:
    config = json.loads((toy_copy / "config.json").read_text())
    (toy_copy / "config.json").write_text(json.dumps({**config, "architectures": [], **fields}))
    (toy_copy / "model.safetensors").write_bytes(b"not weights at all")  # never opened
    run, out = extract(cli, tmp_path, model=str(toy_copy))
    assert run.code == 1 and sentence in run.err and "Traceback" not in run.err
    assert not out.exists()


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json", "model.safetensors"])
def test_missing_model_file_is_refused_by_name(cli, tmp_path: Path, toy_copy: Path, missing: str) -> None:
    (toy_copy / missing).unlink()
    run, out = extract(cli, tmp_path, model=str(toy_copy))
    assert run.code == 1 and not out.exists()
    expected = "*.safetensors weights" if missing == "model.safetensors" else missing
    assert f"model directory {toy_copy} has no {expected}" in run.err


def test_sharded_weights_load_like_one_file(cli, tmp_path: Path, toy_copy: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(toy_copy / "model.safetensors")
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, toy_copy / shard)
    (toy_copy / "model.safetensors").unlink()
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (toy_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    assert extract(cli, sharded, model=str(toy_copy))[0].code == 0
    assert extract(cli, tmp_path)[0].code == 0
    a = json.loads((sharded / "states.json").read_text())["records"]
    b = json.loads((tmp_path / "states.json").read_text())["records"]
    assert [r["layers"] for r in a] == [r["layers"] for r in b]
    os_shard = next(iter(shards))
    (toy_copy / os_shard).unlink()
    run = cli("extract", "--model", toy_copy, "--input", tmp_path / "prompts.json", "--output", tmp_path / "x.json")
    assert run.code == 1 and f"has no {os_shard}, a shard named by model.safetensors.index.json" in run.err


def test_chat_template_applies_to_the_read(cli, tmp_path: Path) -> None:
    run, out = extract(cli, tmp_path, model="ster:toy-chat")
    assert run.code == 0
    assert json.loads(out.read_text())["chat_template"] == "applied"
    assert json.loads(out.read_text())["records"][1]["tokens"] == 8  # <s> question : the sea is answer :


def test_output_that_is_a_directory_is_refused(cli, tmp_path: Path) -> None:
    run = cli("extract", "--model", "ster:toy", "--input", write_prompts(tmp_path / "p.json"), "--output", tmp_path)
    assert run.code == 1 and "is a directory" in run.err
