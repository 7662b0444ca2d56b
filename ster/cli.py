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


def _model_flags(parser: argparse.ArgumentParser, *, chat: bool = True) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", required=True,
                       help="checkpoint directory, Hugging Face Hub id, or ster:toy / ster:toy-chat (bundled)")
    group.add_argument("--revision", help="Hub branch, tag or commit (Hub ids only)")
    group.add_argument("--precision", choices=["f32", "f16", "bf16"], default="f32",
                       help="dtype the frozen weights are held at (default f32)")
    group.add_argument("--device", choices=["cpu", "cuda", "mps", "auto"], default="cpu",
                       help="where the model runs (default cpu)")
    if chat:
        group.add_argument("--chat-template", choices=["auto", "off"], default="auto",
                           help="auto applies the model's own chat template when it has one (default auto)")


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print every event as one JSON object per line on stdout")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. Building it imports nothing beyond the standard library."""
    parser = argparse.ArgumentParser(
        prog="ster",
        description="Representation reading, activation steering and LoRA post-training for Llama-family models.",
        epilog=f"Try: ster generate --model {EXAMPLE_MODEL} --prompt \"question : what is the river like ?\"",
    )
    parser.add_argument("--version", action="version", version=f"ster {__version__}")
    parser.add_argument("--json", action="store_true", help="print every event as one JSON object per line on stdout")
    commands = parser.add_subparsers(dest="command", metavar="<command>")

    generate = commands.add_parser("generate", help="run autoregressive generation from one prompt",
                                   description="Decode from one prompt with a KV cache: greedy at temperature 0, "
                                               "seeded sampling above it. Stops at the tokenizer's EOS.")
    _model_flags(generate)
    generate.add_argument("--prompt", required=True, help="the prompt text")
    generate.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0.0)")
    generate.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold")
    generate.add_argument("--seed", type=int, default=42, help="seed of the sampler (default 42)")
    _json_flag(generate)

    extract = commands.add_parser("extract", help="export hidden states for a prompt set",
                                  description="For each prompt, the last token's residual-stream state after each "
                                              "selected block, written as a versioned JSON document.")
    _model_flags(extract)
    extract.add_argument("--input", required=True, help='JSON file {"prompts": ["...", ...]}')
    extract.add_argument("--output", required=True, help="where to write the activation document")
    extract.add_argument("--layers", default="all", help="all, a comma list (2,5), or a half-open range (2..6)")
    extract.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass (default 8)")
    _json_flag(extract)

    model = commands.add_parser("model", help="import checkpoints into a form every command loads")
    model_commands = model.add_subparsers(dest="model_command", metavar="<subcommand>", required=True)
    gguf = model_commands.add_parser("import", help="convert a Llama GGUF file into a checkpoint directory",
                                     description="Dequantize a Llama GGUF checkpoint into config.json, tokenizer.json, "
                                                 "tokenizer_config.json (with its chat template) and model.safetensors.")
    gguf.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file")
    gguf.add_argument("--output", required=True, help="directory to create")
    _json_flag(gguf)
    return parser


def _request(args: argparse.Namespace) -> tuple[str, Any]:
    """The job name and its validated request for parsed arguments."""
    from ster.engine import requests as rq

    model_fields = {}
    if hasattr(args, "model"):
        model_fields = {"model": args.model, "revision": args.revision, "precision": args.precision,
                        "device": args.device, "chat_template": getattr(args, "chat_template", "auto")}
    if args.command == "generate":
        return "generate", rq.build_request(
            rq.GenerateRequest, **model_fields, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if args.command == "extract":
        return "extract", rq.build_request(
            rq.ExtractRequest, **model_fields, input=args.input, output=args.output, layers=args.layers,
            batch_size=args.batch_size)
    return "model import", rq.build_request(rq.ModelImportRequest, gguf=args.gguf, output=args.output)


def run(name: str, request: Any, emit: Callable[[Any], None]) -> Any:
    """Run a job on a worker thread so Ctrl-C cancels it cooperatively; return its final event."""
    from ster.engine.jobs import run_job

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
    if args.command is None:
        parser.print_help()
        return 0
    from ster.console import renderer_for
    from ster.engine.errors import ExitCode, SterError, exit_code_for
    from ster.engine.events import Error

    render = renderer_for(json_mode=args.json)
    try:
        name, request = _request(args)
    except SterError as exc:
        final = Error(kind=exc.kind, message=str(exc))  # type: ignore[arg-type]
        render(final)
        return int(exc.exit_code)
    final = run(name, request, render)
    render.close()
    return int(ExitCode.OK) if final.type == "result" else int(exit_code_for(final.kind))
