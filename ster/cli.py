"""The ``ster`` command: parse flags into a job request, run the job, render its events.

Parsing imports nothing heavy, so ``ster --help`` and ``ster <command> --help`` load
neither torch nor transformers. Each command maps onto one engine job; this module
only builds the request and chooses how events are shown:

* ``ster <command>``: the result document as pretty JSON on stdout; progress on stderr
  (a live display on a terminal, plain lines otherwise);
* ``ster --json <command>``: every event as one JSON object per line on stdout.

Exit codes: 0 success, 1 refused, 2 usage error, 3 internal error, 130 cancelled.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ster import __version__

EXAMPLE_MODEL = "ster:toy"


def _model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", required=True,
                       help="checkpoint directory, Hugging Face Hub id, or ster:toy / ster:toy-chat (bundled)")
    group.add_argument("--revision", help="Hub branch, tag or commit (Hub ids only)")
    group.add_argument("--precision", choices=["f32", "f16", "bf16"], default="f32",
                       help="dtype the frozen weights are held at (default f32)")
    group.add_argument("--device", choices=["cpu", "cuda", "mps", "auto"], default="cpu",
                       help="where the model runs (default cpu)")
    group.add_argument("--chat-template", choices=["auto", "off"], default="auto",
                       help="auto applies the model's own chat template when it has one (default auto)")


def _sampling_flags(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                        help=f"most tokens to generate (default {max_new_tokens})")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0.0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold")
    parser.add_argument("--seed", type=int, default=42, help="seed of the sampler (default 42)")


def _layer_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", default="all", help="all, a comma list (2,5), or a half-open range (2..6)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass (default 8)")


def _fit_flags(parser: argparse.ArgumentParser, pairs_help: str) -> None:
    _model_flags(parser)
    parser.add_argument("--pairs", help=f"{pairs_help} (default: the workspace's active set)")
    parser.add_argument("--output", required=True, help="where to write the steering artifact")
    _layer_flags(parser)


def _command(commands: Any, name: str, help_text: str, description: str,
             job: str | None = None) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_text, description=description)
    parser.set_defaults(job=job or name)
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print every event as one JSON object per line on stdout")
    return parser


def _add_generate(commands: Any) -> None:
    parser = _command(commands, "generate", "run normal or steered autoregressive generation",
                      "Decode from one prompt with a KV cache: greedy at temperature 0, seeded sampling above "
                      "it; with --vector, strength x direction is added after each of the artifact's layers at "
                      "every step. Stops at the tokenizer's EOS.")
    _model_flags(parser)
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--vector", help="a steering artifact; omit it for the unsteered baseline")
    parser.add_argument("--strength", help="how far along the direction: a multiple of each layer's activation "
                        "norm (0.4x), or a number in the residual stream's units (3); negative steers the other way "
                        "(write --strength=-0.4x); default 0.4x")
    _sampling_flags(parser, 128)


def _add_extract(commands: Any) -> None:
    parser = _command(commands, "extract", "export hidden states for a prompt set",
                      "For each prompt, the last token's residual-stream state after each selected block, "
                      "written as a versioned JSON document.")
    _model_flags(parser)
    parser.add_argument("--input", required=True, help='JSON file {"prompts": ["...", ...]}')
    parser.add_argument("--output", required=True, help="where to write the activation document")
    _layer_flags(parser)


def _add_train(commands: Any) -> None:
    parser = _command(commands, "train", "learn one vector per selected layer",
                      "Fit one unit direction per selected layer from a contrastive pair set and write it as a "
                      "steering artifact; prints the artifact summary with training scores.")
    _fit_flags(parser, 'pair set {"trait_name": ..., "pairs": [...]}')
    parser.add_argument("--method", choices=["caa", "pca", "logistic"], default="caa",
                        help="mean difference, principal direction, or logistic probe (default caa)")


def _add_optimize(commands: Any) -> None:
    parser = _command(commands, "optimize", "select method and layer on an 80/20 holdout",
                      "Fit every method at every selected layer on the first 80%% of the pairs, rank them on the "
                      "rest by accuracy then margin over the layer's activation norm, publish the table, and write "
                      "the winner refitted on all pairs.")
    _fit_flags(parser, "pair set (at least 4 pairs)")


def _add_evaluate(commands: Any) -> None:
    parser = _command(commands, "evaluate", "measure a vector on a contrastive pair set",
                      "Per layer of the artifact: pair-ordering accuracy and mean projection margin.")
    _model_flags(parser)
    parser.add_argument("--pairs", help="pair set to measure on (default: the workspace's active set)")
    parser.add_argument("--vector", required=True, help="the steering artifact")
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per forward pass (default 8)")


def _add_sweep(commands: Any) -> None:
    parser = _command(commands, "sweep", "find the strength where steering starts and where it breaks",
                      "Generate at each strength (0 always included) for each prompt; report per strength the "
                      "effect (how far the text moved along the direction, re-read unsteered: positive is toward "
                      "the trait) with its noise, and degeneracy; suggest per sign the largest fluent strength whose "
                      "effect is distinguishable from 0.")
    _model_flags(parser)
    parser.add_argument("--vector", required=True, help="the steering artifact")
    parser.add_argument("--prompts", required=True, help='JSON file {"prompts": ["...", ...]}')
    parser.add_argument("--strengths", help="comma list, all relative to each layer's activation norm "
                        "(--strengths=-0.4x,0.4x) or all absolute (--strengths=-8,-4,4,8); write = before a leading "
                        "minus; default -0.8x,-0.4x,-0.2x,0.2x,0.4x,0.8x")
    _sampling_flags(parser, 48)


def _add_inspect(commands: Any) -> None:
    parser = _command(commands, "inspect", "summarize and validate a steering artifact",
                      "Validate an artifact and print its summary (no vector values) without loading a model.")
    parser.add_argument("artifact", help="the steering artifact")


def _dedupe_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dedupe-bits", type=int, default=3,
                        help="near-duplicate when SimHash fingerprints differ in at most this many bits (default 3)")
    parser.add_argument("--dedupe-bands", type=int, default=8, help="LSH bands of the 64-bit fingerprint (default 8)")
    parser.add_argument("--refusal-threshold", type=float, default=0.5,
                        help="a side scoring at or above this reads as a refusal (default 0.5)")


def _add_pairs(commands: Any) -> None:
    pairs = commands.add_parser("pairs", help="author, inspect, and synthesize contrastive pair sets")
    sub = pairs.add_subparsers(dest="pairs_command", metavar="<subcommand>", required=True)
    inspect = _command(sub, "inspect", "find duplicates, refusals, lopsided pairs and low diversity; no model",
                       "Inspect a pair set without loading a model: exact and near duplicates (SimHash with "
                       "banded LSH), sides that read as refusals, length balance, and diversity.", "pairs inspect")
    inspect.add_argument("--pairs", help="the pair set (default: the workspace's active set)")
    _dedupe_flags(inspect)
    add = _command(sub, "add", "append one pair (creates the file)", "Append one pair to a pair set, creating "
                   "the file and its parent directory when missing.", "pairs add")
    add.add_argument("--pairs", required=True, help="the pair set file")
    add.add_argument("--positive", required=True, help="the text that shows the trait")
    add.add_argument("--negative", required=True, help="the matched text that does not")
    add.add_argument("--trait", help="set or replace the set's trait name")
    remove = _command(sub, "remove", "remove the pair at an index", "Remove one pair by its zero-based index.",
                      "pairs remove")
    remove.add_argument("--pairs", required=True, help="the pair set file")
    remove.add_argument("--index", required=True, type=int, help="zero-based index of the pair")
    synth = _command(sub, "synthesize", "write a pair set from a trait description",
                     "Generate a pair set from a one-sentence trait description, with the local model (default) "
                     "or a hosted model through the Brama gateway (BRAMA_URL, BRAMA_BEARER).", "pairs synthesize")
    synth.add_argument("--trait", required=True, help="the trait, described in one sentence")
    synth.add_argument("--count", required=True, type=int, help="pairs to keep")
    synth.add_argument("--output", required=True, help="where to write the pair set")
    synth.add_argument("--generator", default="local", help="local (default) or brama")
    synth.add_argument("--generator-model", help="the Brama route (brama only)")
    synth.add_argument("--model", help="the local checkpoint (local only)")
    synth.add_argument("--revision", help="Hub branch, tag or commit (local only)")
    synth.add_argument("--device", choices=["cpu", "cuda", "mps", "auto"], default="cpu")
    synth.add_argument("--chat-template", choices=["auto", "off"], default="auto")
    synth.add_argument("--precision", choices=["f32", "f16", "bf16"], default="f32")
    synth.add_argument("--trait-name", help="the set's trait_name (default: derived from --trait)")
    synth.add_argument("--opposite", help="the opposite trait (default: derived with one generation)")
    synth.add_argument("--retry-multiplier", type=int, default=3, help="attempt budget = count x this (default 3)")
    _dedupe_flags(synth)
    synth.add_argument("--max-new-tokens", type=int, default=96)
    synth.add_argument("--temperature", type=float, default=0.9)
    synth.add_argument("--top-p", type=float, default=0.95)
    synth.add_argument("--seed", type=int, default=42)


def _add_workspace(commands: Any) -> None:
    workspace = commands.add_parser("workspace", help="import, activate, and inspect persistent pair sets")
    sub = workspace.add_subparsers(dest="workspace_command", metavar="<subcommand>", required=True)
    imports = _command(sub, "import-pairs", "keep a canonical copy of a pair set and make it active",
                       "Validate a pair set, copy it under $XDG_DATA_HOME/ster, and make it the active set.",
                       "workspace import-pairs")
    imports.add_argument("source", help="the pair set to import")
    imports.add_argument("--name", help="the id of the copy (default: the file name)")
    _command(sub, "show", "list the imported sets and the active one", "List the imported pair sets.",
             "workspace show")
    select = _command(sub, "select", "make an imported set the active one", "Activate an imported set.",
                      "workspace select")
    select.add_argument("id", help="the set's id")
    remove = _command(sub, "remove", "forget an imported set", "Remove an imported set and its copy.",
                      "workspace remove")
    remove.add_argument("id", help="the set's id")


def _add_onboarding(commands: Any) -> None:
    parser = _command(commands, "onboarding", "import or replay first use",
                      "The first-use walkthrough. It ends when a pair set is imported or written.")
    parser.add_argument("--reset", action="store_true", help="start the walkthrough over")
    parser.add_argument("--import-pairs", help="import this pair set into the workspace")
    parser.add_argument("--name", help="the id of the imported copy")


STEERING = (_add_train, _add_optimize, _add_evaluate, _add_generate, _add_extract, _add_sweep, _add_inspect)


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. Building it imports nothing beyond the standard library."""
    parser = argparse.ArgumentParser(
        prog="ster",
        description="Representation reading, activation steering and LoRA post-training for Llama-family models.",
        epilog=f'Try: ster generate --model {EXAMPLE_MODEL} --prompt "question : what is the river like ? answer :"',
    )
    parser.add_argument("--version", action="version", version=f"ster {__version__}")
    parser.add_argument("--json", action="store_true", help="print every event as one JSON object per line on stdout")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    for add in STEERING:
        add(commands)
    vector = commands.add_parser("vector", help="the steering commands again, as ster vector <command>")
    vector_commands = vector.add_subparsers(dest="vector_command", metavar="<command>", required=True)
    for add in STEERING:
        add(vector_commands)
    tui = commands.add_parser("tui", help="open the full-screen app (also: ster with no arguments on a terminal)",
                              description="The full-screen app: author pairs, train and select a direction, "
                                          "compare steered with unsteered generation.")
    tui.add_argument("--model", default="ster:toy", help="the model to start with (default ster:toy)")
    tui.add_argument("--pairs", help="the pair set to open")
    _add_pairs(commands)
    _add_workspace(commands)
    _add_onboarding(commands)
    model = commands.add_parser("model", help="import checkpoints into a form every command loads")
    model_commands = model.add_subparsers(dest="model_command", metavar="<subcommand>", required=True)
    gguf = _command(model_commands, "import", "convert a Llama GGUF file into a checkpoint directory",
                    "Dequantize a Llama GGUF checkpoint into config.json, tokenizer.json, tokenizer_config.json "
                    "(with its chat template) and model.safetensors.", "model import")
    gguf.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file")
    gguf.add_argument("--output", required=True, help="directory to create")
    return parser


def _request(args: argparse.Namespace) -> Any:
    """The validated request for parsed arguments: every parsed flag becomes a field of the same name."""
    from ster.engine.protocol.jobs import build_job_request

    fields = {k: v for k, v in vars(args).items() if k != "job" and k != "json" and not k.endswith("command")}
    return build_job_request(args.job, **fields)


def run(name: str, request: Any, emit: Callable[[Any], None]) -> Any:
    """Run a job on a worker thread so Ctrl-C cancels it cooperatively; return its final event."""
    from ster.engine.protocol.jobs import run_job

    cancel = threading.Event()
    finished: list[Any] = []
    worker = threading.Thread(target=lambda: finished.append(run_job(name, request, emit, cancel)), daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        print("cancelling; press Ctrl-C again to stop at once", file=sys.stderr)
        try:
            worker.join()
        except KeyboardInterrupt:
            os._exit(130)
    return finished[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ster`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tui" or (args.command is None and argv is None and sys.stdin.isatty()
                                 and sys.stdout.isatty()):
        from pathlib import Path

        from ster.tui.app import run_tui

        pairs = getattr(args, "pairs", None)
        return run_tui(getattr(args, "model", None), Path(pairs) if pairs else None)
    if args.command is None:
        parser.print_help()
        return 0
    from ster.console import renderer_for
    from ster.engine.protocol.errors import ExitCode, SterError, exit_code_for
    from ster.engine.protocol.events import Error

    render = renderer_for(json_mode=args.json)
    try:
        request = _request(args)
    except SterError as exc:
        render(Error(kind=exc.kind, message=str(exc)))  # type: ignore[arg-type]
        return int(exc.exit_code)
    final = run(args.job, request, render)
    render.close()
    return int(ExitCode.OK) if final.type == "result" else int(exit_code_for(final.kind))
