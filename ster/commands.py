"""The command tree: every command, flag and help text of ``ster``, and nothing else.

Building it imports only the standard library, so ``ster --help`` stays fast. Flags
take their values as text: argparse checks the command's shape (known commands and
flags, required flags present, each value-taking flag given a value, exit 2), and the
job's request model checks every value (a refusal in one sentence, exit 1). The choices
a flag offers are listed in its help so that they stay visible; the request models hold
the same lists (tested in ``tests/protocol/test_bad_values.py``).

Defaults live in the request models only. A flag left out is left out of the parsed
arguments (``argparse.SUPPRESS``), so the request's own default applies, as it does for a
body sent to ``ster serve``; a help text says ``DEFAULT`` where the default goes, and
:class:`CommandParser` reads it from the request model when that help is shown.
"""

from __future__ import annotations

import argparse
from typing import Any

from ster import __version__

DEFAULT = "{default}"
"""Where a flag's help shows its default, read from the request model of the flag's command (see
:func:`ster.engine.protocol.jobs.request_default`)."""

EXAMPLE_MODEL = "ster:toy"
PRECISIONS = ("f32", "f16", "bf16", "int8")
DEVICES = ("cpu", "cuda", "mps", "metal", "auto")
CHAT_MODES = ("auto", "off")
METHODS = ("caa", "pca", "logistic")
GENERATORS = ("local", "brama")
MODES = ("add", "ablate", "clamp")
CALIBRATION_MODES = ("add", "ablate")
FORMATS = ("checkpoint", "lora", "llama-cpp", "lm-eval")
LAYERS_HELP = (
    "all, or a comma list of layers and half-open ranges, such as 2,5 or 12..24 or 1,4..7 (layers 1, 4, 5, 6); "
    f"default {DEFAULT}"
)


class CommandParser(argparse.ArgumentParser):
    """A parser whose help shows each flag's default as its command's request model holds it.

    ``DEFAULT`` in a flag's help is replaced the first time the help is formatted, so the request models load
    for ``ster <command> --help`` only, never for ``ster --help`` or to parse a command line: with pydantic,
    importing them takes about 0.15 s, twice what the whole of ``ster --help`` takes.
    """

    def format_help(self) -> str:
        from ster.engine.protocol.jobs import request_default

        job = self.get_default("job")
        for action in self._actions:
            if action.help and DEFAULT in action.help:
                action.help = action.help.replace(DEFAULT, request_default(job, action.dest))
        return super().format_help()


def _choices(values: tuple[str, ...]) -> str:
    return "{" + ",".join(values) + "}"


def _model_flags(parser: argparse.ArgumentParser, required: bool = True, route: str = "") -> None:
    group = parser.add_argument_group("model" + route)
    group.add_argument(
        "--model",
        required=required,
        metavar="MODEL",
        help="checkpoint directory, Hugging Face Hub id, or ster:toy / ster:toy-chat (bundled)",
    )
    group.add_argument(
        "--revision",
        metavar="REV",
        help="Hub branch, tag or commit; with a local directory it is only recorded, with a warning",
    )
    group.add_argument(
        "--precision",
        metavar=_choices(PRECISIONS),
        help=f"dtype the frozen weights are held at (default {DEFAULT})",
    )
    group.add_argument(
        "--device",
        metavar=_choices(DEVICES),
        help="where the model runs; metal is another name for mps, auto takes the first accelerator "
        f"present (default {DEFAULT})",
    )
    group.add_argument(
        "--chat-template",
        metavar=_choices(CHAT_MODES),
        help=f"auto applies the model's own chat template when it has one (default {DEFAULT})",
    )


def _sampling_flags(parser: argparse.ArgumentParser, within_context: bool = True) -> None:
    group = parser.add_argument_group("sampling")
    context = ", or fewer when the model's context ends sooner; a larger value than the context allows is refused"
    group.add_argument(
        "--max-new-tokens",
        metavar="N",
        help=f"most tokens to generate (default {DEFAULT}{context if within_context else ''})",
    )
    group.add_argument("--temperature", metavar="T", help=f"0 decodes greedily, above 0 samples (default {DEFAULT})")
    group.add_argument(
        "--top-p",
        metavar="P",
        help="nucleus sampling: keep the likeliest tokens up to probability P, above 0 and at most 1 "
        f"(default {DEFAULT})",
    )
    group.add_argument(
        "--seed",
        metavar="N",
        help=f"seed of the sampler, 0 to 2^64-1; used when the temperature is above 0 (default {DEFAULT})",
    )


def _apply_adapter_flag(parser: argparse.ArgumentParser, what: str = "every forward pass") -> None:
    parser.add_argument(
        "--adapter",
        metavar="FILE",
        help=f"a LoRA adapter (.safetensors with its .json sidecar, or a PEFT adapter directory) "
        f"attached for {what} (default: the bare checkpoint)",
    )


def _intervention_flags(parser: argparse.ArgumentParser, strength: str) -> None:
    """``--mode`` and what shapes an ablation or a clamp, as generate and sweep take them; ``strength`` names the
    flag that gives each mode its amount."""
    parser.add_argument(
        "--mode",
        metavar=_choices(MODES),
        help=f"add steers along the direction at the artifact's layers; ablate removes the component along it "
        f"(h - w(h.v)v) and clamp sets it to {strength} (h + w(c - h.v)v), at the embedding and after every "
        f"block; with ablate, {strength} is the weight w (1 removes all of it); default {DEFAULT}",
    )
    parser.add_argument(
        "--layers",
        metavar="LAYERS",
        help="narrow where the mode applies to these blocks (all, 2,5, 12..24); default: the artifact's layers "
        "(add), the embedding and every block (ablate, clamp)",
    )
    parser.add_argument(
        "--direction-layer",
        metavar="N",
        help="ablate and clamp with the artifact's direction at layer N everywhere (default: each site takes the "
        "direction of the artifact's nearest layer)",
    )
    parser.add_argument(
        "--peak-weight", metavar="W", help=f"the weight of an ablation or a clamp at its peak (default {DEFAULT})"
    )
    parser.add_argument(
        "--peak-layer",
        metavar="L",
        help="the layer where the weight peaks; with --falloff it falls linearly toward --min-weight and stops "
        "beyond (default: the peak weight everywhere)",
    )
    parser.add_argument("--min-weight", metavar="W", help="the weight --falloff layers from the peak")
    parser.add_argument("--falloff", metavar="D", help="how many layers either side of --peak-layer are edited")


def _layer_flags(parser: argparse.ArgumentParser, unit: str = "sequences") -> None:
    parser.add_argument("--layers", metavar="LAYERS", help=LAYERS_HELP)
    parser.add_argument("--batch-size", metavar="N", help=f"{unit} per forward pass (default {DEFAULT})")


def _fit_flags(parser: argparse.ArgumentParser, pairs_help: str) -> None:
    _model_flags(parser)
    parser.add_argument("--pairs", metavar="FILE", help=f"{pairs_help} (default: the workspace's active set)")
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the steering artifact")
    _apply_adapter_flag(parser, "reading the pairs")
    _layer_flags(parser, "pairs")


def _command(
    commands: Any, name: str, help_text: str, description: str, job: str | None = None
) -> argparse.ArgumentParser:
    """A job's command: every flag left out is left out of the parsed arguments, so its request's default
    applies."""
    parser = commands.add_parser(name, help=help_text, description=description, argument_default=argparse.SUPPRESS)
    parser.set_defaults(job=job or name)
    parser.add_argument("--json", action="store_true", help="print every event as one JSON object per line on stdout")
    return parser


def _add_generate(commands: Any) -> None:
    parser = _command(
        commands,
        "generate",
        "generate text, steered or not",
        "Decode from one prompt with a KV cache: greedy at temperature 0, seeded sampling above "
        "it; with --vector, strength x direction is added after each of the artifact's layers at "
        "every step (--mode ablate or clamp removes or sets the component along the direction instead). "
        "Stops at the tokenizer's end of text or after --max-new-tokens.",
    )
    _model_flags(parser)
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--vector", metavar="FILE", help="a steering artifact; omit it for the unsteered baseline")
    parser.add_argument(
        "--strength",
        metavar="S",
        help="how far along the direction: a multiple of each layer's activation spread (0.4x), or a "
        "number in the residual stream's units (3); negative steers the other way (write "
        f"--strength=-0.4x); with --mode ablate the weight (default 1), with clamp the target; default {DEFAULT}",
    )
    _intervention_flags(parser, "--strength")
    _apply_adapter_flag(parser, "every generated token; combinable with --vector")
    _sampling_flags(parser)


def _add_extract(commands: Any) -> None:
    parser = _command(
        commands,
        "extract",
        "export hidden states for a prompt set",
        "For each prompt, the last token's residual-stream state after each selected block, "
        "written as a versioned JSON document.",
    )
    _model_flags(parser)
    parser.add_argument("--input", required=True, metavar="FILE", help='JSON file {"prompts": ["...", ...]}')
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the activation document")
    _apply_adapter_flag(parser, "reading the prompts")
    _layer_flags(parser, "prompts")


def _add_train(commands: Any) -> None:
    parser = _command(
        commands,
        "train",
        "fit one direction per selected layer",
        "Fit one unit direction per selected layer from a contrastive pair set and write it as a "
        "steering artifact; prints the artifact's summary with training scores.",
    )
    _fit_flags(parser, 'pair set {"trait_name": ..., "pairs": [...]}')
    parser.add_argument(
        "--method",
        metavar=_choices(METHODS),
        help=f"mean difference, principal direction, or logistic probe (default {DEFAULT})",
    )


def _add_optimize(commands: Any) -> None:
    parser = _command(
        commands,
        "optimize",
        "choose method and layer on an 80/20 holdout",
        "Fit every method at every selected layer on the first 80% of the pairs, rank them on the "
        "rest by accuracy, then separation (margin over the spread of the held-out projections), publish "
        "the table, and write the winner refitted on all pairs.",
    )
    _fit_flags(parser, "pair set with at least 4 pairs")


def _add_evaluate(commands: Any) -> None:
    parser = _command(
        commands,
        "evaluate",
        "measure a steering artifact on a pair set",
        "Per layer of the artifact: pair-ordering accuracy and mean projection margin.",
    )
    _model_flags(parser)
    parser.add_argument("--pairs", metavar="FILE", help="pair set to measure on (default: the workspace's active set)")
    parser.add_argument("--vector", required=True, metavar="FILE", help="the steering artifact")
    _apply_adapter_flag(parser, "reading the pairs")
    parser.add_argument("--batch-size", metavar="N", help=f"pairs per forward pass (default {DEFAULT})")


def _add_sweep(commands: Any) -> None:
    parser = _command(
        commands,
        "sweep",
        "find the strength where steering starts and where it breaks",
        "Generate at each strength (0 always included) for each prompt; report per strength the "
        "effect (how far the text moved along the direction, re-read unsteered: positive is toward "
        "the trait) with its noise, degeneracy, KL from the unsteered model on neutral prompts, "
        "fluency and (with --holdout) behaviour; suggest per sign the largest fluent strength whose "
        "effect is distinguishable from 0, and the largest within --kl-budget.",
    )
    _model_flags(parser)
    parser.add_argument("--vector", required=True, metavar="FILE", help="the steering artifact")
    parser.add_argument("--prompts", required=True, metavar="FILE", help='JSON file {"prompts": ["...", ...]}')
    parser.add_argument(
        "--strengths",
        metavar="LIST",
        help="comma list, all relative to each layer's activation spread (--strengths=-0.4x,0.4x) or "
        f"all absolute (--strengths=-8,-4,4,8); write = before a leading minus; with --mode ablate, weights "
        f"(default 0.25,0.5,1); 0 is always the unedited model; default {DEFAULT}",
    )
    _intervention_flags(parser, "each strength")
    _cost_flags(
        parser,
        "each strength's KL from the unsteered model is measured on (default ster:neutral)",
        "the mean KL, in nats per token, a strength may cost to be suggested by the budget",
    )
    parser.add_argument(
        "--neutral-count",
        metavar="N",
        help=f"how many neutral prompts, spread through the set, the KL is measured on (default {DEFAULT})",
    )
    parser.add_argument(
        "--holdout",
        metavar="FILE",
        help="pair set whose behaviour (log p(positive side) - log p(negative side)) is measured at "
        "each strength (default: none)",
    )
    _apply_adapter_flag(parser, "generating the texts and re-reading them")
    _sampling_flags(parser)


def _cost_flags(parser: Any, measured: str, budget: str) -> None:
    """``--neutral`` and ``--kl-budget``, as sweep and calibrate take them; ``measured`` and ``budget`` end their
    help."""
    parser.add_argument(
        "--neutral", metavar="FILE", help=f'JSON file {{"prompts": [...]}} of everyday requests {measured}'
    )
    parser.add_argument("--kl-budget", metavar="B", help=f"{budget} (default {DEFAULT})")


def _add_calibrate(commands: Any) -> None:
    parser = _command(
        commands,
        "calibrate",
        "choose layer, method and strength per sign within a KL budget",
        "Fit caa, pca and logistic directions on the pairs, measure each candidate (a layer or a "
        "contiguous range) at a ladder of strengths both ways: behaviour on held-out pairs (log "
        "p(positive side) - log p(negative side)) and cost on a neutral prompt set (KL from the "
        "unsteered model over its own continuation); choose the candidate that moves behaviour most "
        "within --kl-budget, show the Pareto front, and write the artifact with its calibration. "
        "Ctrl-C leaves a study beside --output that --resume continues.",
    )
    _model_flags(parser)
    parser.add_argument("--pairs", metavar="FILE", help="pair set to fit on (default: the workspace's active set)")
    parser.add_argument(
        "--holdout",
        metavar="FILE",
        help="pair set to measure behaviour on (default: the last 20%% of --pairs, held out from fitting)",
    )
    _cost_flags(
        parser,
        "the cost is measured on (default ster:neutral, 72 bundled requests)",
        "most mean KL from the unsteered model, in nats per token, a chosen strength may cost",
    )
    parser.add_argument("--trials", metavar="N", help=f"most candidates to measure (default {DEFAULT})")
    parser.add_argument(
        "--seed", metavar="N", help=f"picks the prompts and pairs candidates are screened on (default {DEFAULT})"
    )
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the calibrated artifact")
    parser.add_argument("--resume", action="store_true", help="continue the study an interrupted run left")
    parser.add_argument(
        "--judge",
        metavar="MODEL",
        help="a local instruct model asked whether each answer shows the trait, read as p(yes); "
        "none runs no judge (default: the model itself when it has a chat template)",
    )
    parser.add_argument(
        "--judge-question",
        metavar="TEXT",
        help="the judge's question, with {text} where the answer goes and {trait} for the pair "
        "set's trait (default: asks whether the reply is {trait})",
    )
    parser.add_argument(
        "--mode",
        metavar=_choices(CALIBRATION_MODES),
        help="add calibrates steering (layers, method and strength per sign, against held-out behaviour); "
        "ablate calibrates an ablation of the direction (its layer and weight profile, against the share of the "
        "held-out pairs' positive prompts refused, and first-token KL); "
        f"default {DEFAULT}",
    )
    parser.add_argument(
        "--refusal-markers",
        metavar="FILE",
        help="with --mode ablate: a JSON list of the phrases that mark an answer as a refusal (default: the "
        "built-in list the README prints)",
    )
    _apply_adapter_flag(parser, "reading and steering")
    _layer_flags(parser, "pairs")


def _add_bake(commands: Any) -> None:
    parser = _command(
        commands,
        "bake",
        "write a direction in the form another engine runs",
        "Fold an artifact's direction, added or ablated, into a standalone checkpoint (the family's own layout), "
        "a rank-1 PEFT LoRA, a llama.cpp control vector (GGUF), or lm-evaluation-harness's steering file. An "
        "ablation at the embedding and after every block bakes exactly into checkpoint and lora; steering into "
        "a checkpoint needs a bias on the MLP down projection, which transformers gives Llama only.",
    )
    _model_flags(parser)
    parser.add_argument("--vector", required=True, metavar="FILE", help="the steering artifact")
    parser.add_argument(
        "--format",
        metavar=_choices(FORMATS),
        help="checkpoint (a directory; add or ablate), lora (a PEFT directory; ablate), llama-cpp (a control "
        f"vector GGUF; add), lm-eval (a .pt steering file; add, ablate, clamp); default {DEFAULT}",
    )
    parser.add_argument(
        "--strength",
        metavar="S",
        help="as generate takes it: the weight of an ablation (1 when not given: all of it), the target of a "
        "clamp, or what is added (0.4x or 3; a calibrated artifact's own strength when not given); "
        f"default {DEFAULT}",
    )
    parser.add_argument("--output", required=True, metavar="PATH", help="the directory or file to write")
    _intervention_flags(parser, "--strength")


def _add_vector_import(commands: Any) -> None:
    parser = _command(
        commands,
        "import",
        "read a llama.cpp or repeng control vector into a steering artifact",
        "Read a control-vector GGUF (llama.cpp's cvector-generator, repeng, or ster bake --format llama-cpp; "
        "controlvector.* or steeringvector.* keys) into a steering artifact bound to --model: each direction at "
        "unit length, its length kept so that --strength 1x adds the vector as it was. The file records no "
        "fingerprint of its model, so only its width and blocks are checked, and a warning says so.",
        job="vector import",
    )
    parser.add_argument("control_vector", metavar="FILE", help="the control-vector GGUF")
    _model_flags(parser)
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the steering artifact")
    parser.add_argument("--trait-name", metavar="NAME", help="the artifact's trait (default: the file's name)")


def _add_inspect(commands: Any) -> None:
    parser = _command(
        commands,
        "inspect",
        "validate a steering artifact and summarise it",
        "Validate an artifact and print its summary (no vector values) without loading a model.",
    )
    parser.add_argument("artifact", metavar="FILE", help="the steering artifact")


def _dedupe_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dedupe-bits",
        metavar="N",
        help=f"near-duplicates differ in at most N of their 64 SimHash bits, 0 to 63 (default {DEFAULT})",
    )
    parser.add_argument(
        "--dedupe-bands",
        metavar="N",
        help=f"LSH bands the fingerprint is cut into to find near-duplicates, 1 to 64 (default {DEFAULT})",
    )
    parser.add_argument(
        "--refusal-threshold",
        metavar="X",
        help=f"a side scoring at or above X, 0 to 1, reads as a refusal (default {DEFAULT})",
    )


def _add_synthesize(commands: Any) -> None:
    synth = _command(
        commands,
        "synthesize",
        "write a pair set from a trait description",
        "Generate a pair set from a one-sentence trait description, with a local model (default) "
        "or a hosted model through the Brama gateway (BRAMA_URL, BRAMA_BEARER).",
        "pairs synthesize",
    )
    synth.add_argument("--trait", required=True, metavar="TEXT", help="the trait, described in one sentence")
    synth.add_argument("--count", required=True, metavar="N", help="pairs to keep")
    synth.add_argument("--output", required=True, metavar="FILE", help="where to write the pair set")
    synth.add_argument(
        "--generator",
        metavar=_choices(GENERATORS),
        help=f"who writes the text: a local model (--model) or Brama (--generator-model) (default {DEFAULT})",
    )
    synth.add_argument("--generator-model", metavar="ROUTE", help="the Brama alias or provider/model route")
    synth.add_argument("--trait-name", metavar="NAME", help="the set's trait_name (default: derived from --trait)")
    synth.add_argument("--opposite", metavar="TEXT", help="the opposite trait (default: derived with one generation)")
    synth.add_argument("--retry-multiplier", metavar="N", help=f"give up after count x N attempts (default {DEFAULT})")
    _dedupe_flags(synth)
    _model_flags(synth, required=False, route=" (--generator local)")
    _sampling_flags(synth, within_context=False)


def _add_pairs(commands: Any) -> None:
    pairs = commands.add_parser(
        "pairs",
        help="author, inspect, and synthesize contrastive pair sets",
        description="Contrastive pair sets: matched texts that show a trait and do not.",
    )
    sub = pairs.add_subparsers(dest="pairs_command", metavar="<subcommand>", required=True)
    inspect = _command(
        sub,
        "inspect",
        "find duplicates, refusals, lopsided pairs and low diversity; no model",
        "Inspect a pair set without loading a model: exact and near duplicates (SimHash with "
        "banded LSH), sides that read as refusals, length balance, and diversity.",
        "pairs inspect",
    )
    inspect.add_argument("--pairs", metavar="FILE", help="the pair set (default: the workspace's active set)")
    _dedupe_flags(inspect)
    inspect.add_argument(
        "--model",
        metavar="MODEL",
        help="count each side in this model's tokens against its "
        "context (reads its tokenizer and config, never its weights)",
    )
    inspect.add_argument("--revision", metavar="REV", help="Hub branch, tag or commit of --model (Hub ids only)")
    inspect.add_argument(
        "--chat-template",
        metavar=_choices(CHAT_MODES),
        help=f"encode the sides as train would: auto applies the model's template (default {DEFAULT})",
    )
    add = _command(
        sub,
        "add",
        "append one pair (creates the file)",
        "Append one pair to a pair set, creating the file and its parent directory when missing.",
        "pairs add",
    )
    add.add_argument("--pairs", required=True, metavar="FILE", help="the pair set file")
    add.add_argument("--positive", required=True, metavar="TEXT", help="the text that shows the trait")
    add.add_argument("--negative", required=True, metavar="TEXT", help="the matched text that does not")
    add.add_argument("--trait", metavar="NAME", help="set or replace the set's trait name")
    remove = _command(
        sub, "remove", "remove the pair at an index", "Remove one pair by its zero-based index.", "pairs remove"
    )
    remove.add_argument("--pairs", required=True, metavar="FILE", help="the pair set file")
    remove.add_argument("--index", required=True, metavar="N", help="zero-based index of the pair")
    _add_synthesize(sub)


def _add_workspace(commands: Any) -> None:
    workspace = commands.add_parser(
        "workspace",
        help="import, activate, and inspect persistent pair sets",
        description="Pair sets kept under $XDG_DATA_HOME/ster (else ~/.local/share/ster), "
        "one of them active: train, optimize, evaluate and pairs inspect "
        "use it when --pairs is omitted.",
    )
    sub = workspace.add_subparsers(dest="workspace_command", metavar="<subcommand>", required=True)
    imports = _command(
        sub,
        "import-pairs",
        "keep a canonical copy of a pair set and make it active",
        "Validate a pair set, copy it under $XDG_DATA_HOME/ster, and make it the active set.",
        "workspace import-pairs",
    )
    imports.add_argument("source", metavar="FILE", help="the pair set to import")
    imports.add_argument("--name", help="the id of the copy (default: the file name)")
    _command(sub, "show", "list the imported sets and the active one", "List the imported pair sets.", "workspace show")
    select = _command(
        sub, "select", "make an imported set the active one", "Activate an imported set.", "workspace select"
    )
    select.add_argument("id", help="the set's id")
    remove = _command(
        sub, "remove", "forget an imported set", "Remove an imported set and its copy.", "workspace remove"
    )
    remove.add_argument("id", help="the set's id")


def _add_onboarding(commands: Any) -> None:
    parser = _command(
        commands,
        "onboarding",
        "show or replay the first-use walkthrough",
        "The first-use walkthrough: what a pair set is and how to get one. It ends when a pair set "
        "is imported or written.",
    )
    parser.add_argument("--reset", action="store_true", help="start the walkthrough over")
    parser.add_argument("--import-pairs", metavar="FILE", help="import this pair set into the workspace")
    parser.add_argument("--name", help="the id of the imported copy")


def _add_model(commands: Any) -> None:
    model = commands.add_parser(
        "model",
        help="convert a GGUF file into a checkpoint directory",
        description="Checkpoints in a form every command loads.",
    )
    model_commands = model.add_subparsers(dest="model_command", metavar="<subcommand>", required=True)
    gguf = _command(
        model_commands,
        "import",
        "convert a GGUF file into a checkpoint directory",
        "Dequantize a GGUF checkpoint (llama, qwen2, qwen3, phi3 or gemma3) into config.json, tokenizer.json, tokenizer_config.json "
        "(with its chat template) and model.safetensors.",
        "model import",
    )
    gguf.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file")
    gguf.add_argument("--output", required=True, metavar="DIR", help="the directory to create (new, or empty)")


TARGETS_HELP = (
    "projections that carry an adapter: query, key, value, output, gate, up, down (or q_proj, k_proj, "
    f"v_proj, o_proj, gate_proj, up_proj, down_proj); default {DEFAULT}"
)


def _adapter_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("adapter")
    group.add_argument("--rank", metavar="N", help=f"rank of each LoRA factor pair (default {DEFAULT})")
    group.add_argument(
        "--alpha", metavar="X", help=f"scale numerator: the update is alpha/rank x B A (default {DEFAULT})"
    )
    group.add_argument("--targets", metavar="LIST", help=TARGETS_HELP)
    group.add_argument("--layers", metavar="LAYERS", help=LAYERS_HELP)


def _run_flags(parser: argparse.ArgumentParser, unit: str, grpo: bool = False) -> None:
    group = parser.add_argument_group("run")
    group.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="the adapter's .safetensors file; its sidecar is written beside it with .json",
    )
    if grpo:
        group.add_argument("--iterations", metavar="N", help=f"passes over the prompts (default {DEFAULT})")
    else:
        group.add_argument("--epochs", metavar="N", help=f"passes over the data (default {DEFAULT})")
    group.add_argument("--learning-rate", metavar="LR", help=f"AdamW's base rate (default {DEFAULT})")
    group.add_argument(
        "--accumulation", metavar="N", help=f"forwards folded into one optimizer step (default {DEFAULT})"
    )
    group.add_argument(
        "--warmup-steps",
        metavar="N",
        help=f"steps of linear warmup before the cosine decay to a tenth of the rate (default {DEFAULT})",
    )
    group.add_argument(
        "--max-sequence",
        metavar="N",
        help=f"longest sequence in tokens, capped at the model's context; a longer {unit} is "
        f"skipped, never cut (default {DEFAULT})",
    )
    if not grpo:
        group.add_argument(
            "--batch-size", metavar="N", help=f"{unit}s per forward pass (a pair is two rows; default {DEFAULT})"
        )
    sampled = " and every sampled completion" if grpo else ""
    group.add_argument(
        "--seed", metavar="N", help=f"seeds the adapter's draw, the shuffle{sampled} (default {DEFAULT})"
    )
    group.add_argument(
        "--checkpoint-every",
        metavar="N",
        help=f"write a resumable checkpoint beside the output every N steps (default {DEFAULT}: only when interrupted)",
    )
    group.add_argument("--resume", action="store_true", help="continue from the checkpoint beside the output")


def _add_tune(commands: Any) -> None:
    tune = commands.add_parser(
        "tune",
        help="train, evaluate, merge, inspect and export LoRA adapters",
        description="LoRA post-training: supervised fine-tuning, preference optimization "
        "(DPO, IPO), reward models; evaluation, merging, inspection and export.",
    )
    sub = tune.add_subparsers(dest="tune_command", metavar="<subcommand>", required=True)
    sft = _command(
        sub,
        "sft",
        "supervised fine-tuning on prompt/completion examples",
        "Train a LoRA adapter with next-token cross-entropy on the completion tokens only.",
        "tune sft",
    )
    _model_flags(sft)
    sft.add_argument(
        "--examples",
        required=True,
        metavar="FILE",
        help='{"examples": [{"prompt", "completion"}]}, or JSON Lines with prompt/completion or messages',
    )
    _adapter_flags(sft)
    _run_flags(sft, "example")
    for name, help_text, description in (
        (
            "dpo",
            "direct preference optimization (or IPO) on preference pairs",
            (
                "Train a LoRA adapter to prefer each pair's positive (chosen) side over its negative (rejected) side, "
                "relative to the frozen base model."
            ),
        ),
        (
            "reward",
            "train a reward model (Bradley-Terry) on preference pairs",
            "Train a LoRA adapter and a scalar head that scores the chosen side above the rejected one.",
        ),
    ):
        parser = _command(sub, name, help_text, description, f"tune {name}")
        _model_flags(parser)
        parser.add_argument(
            "--pairs",
            metavar="FILE",
            help="a pair set (positive chosen, negative rejected), or JSON "
            "Lines with prompt/chosen/rejected (default: the "
            "workspace's active set)",
        )
        _adapter_flags(parser)
        if name == "dpo":
            parser.add_argument(
                "--beta", metavar="B", help=f"strength of the pull toward the reference (default {DEFAULT})"
            )
            parser.add_argument(
                "--loss",
                metavar="{dpo,ipo}",
                help=f"sigmoid (dpo) or squared (ipo) preference loss (default {DEFAULT})",
            )
        _run_flags(parser, "pair")
    grpo = _command(
        sub,
        "grpo",
        "group-relative policy optimization on completions the model samples",
        "For each prompt, sample --group completions from the adapted model, score them with the reward "
        "source, and step the adapter toward the completions that beat their group's mean, with a KL pull "
        "(--beta) toward the frozen base.",
        "tune grpo",
    )
    _model_flags(grpo)
    grpo.add_argument(
        "--prompts",
        required=True,
        metavar="FILE",
        help='{"prompts": ["..."]}, as extract reads (ster:grpo-prompts has six for the toy)',
    )
    grpo.add_argument(
        "--reward",
        metavar="SOURCE",
        help=f"length (the completion's token count) or a reward model written by tune reward (default {DEFAULT})",
    )
    grpo.add_argument("--group", metavar="N", help=f"completions sampled per prompt, at least 2 (default {DEFAULT})")
    grpo.add_argument(
        "--beta", metavar="B", help=f"weight of the KL pull toward the frozen base (default {DEFAULT}; 0 turns it off)"
    )
    _adapter_flags(grpo)
    sampling = grpo.add_argument_group("sampling")
    sampling.add_argument("--max-new-tokens", metavar="N", help=f"longest completion (default {DEFAULT})")
    sampling.add_argument("--temperature", metavar="T", help=f"above 0 (default {DEFAULT})")
    sampling.add_argument("--top-p", metavar="P", help=f"nucleus sampling (default {DEFAULT})")
    _run_flags(grpo, "prompt", grpo=True)
    evaluate = _command(
        sub,
        "evaluate",
        "completion loss and perplexity, or preference accuracy, on held-out data",
        "Score a checkpoint, or a checkpoint with an adapter, on held-out examples (completion-token "
        "loss and perplexity), or an adapter on held-out preference pairs (a DPO adapter's implicit-"
        "reward accuracy, a reward model's ranking accuracy); writes nothing.",
        "tune evaluate",
    )
    _model_flags(evaluate)
    evaluate.add_argument("--examples", metavar="FILE", help="held-out examples (this or --pairs)")
    evaluate.add_argument(
        "--pairs",
        metavar="FILE",
        help="held-out preference pairs, positive chosen; needs --adapter (this or --examples)",
    )
    evaluate.add_argument(
        "--adapter", metavar="FILE", help="an adapter, or with --pairs a reward model (default: the bare checkpoint)"
    )
    evaluate.add_argument(
        "--beta",
        metavar="B",
        help=f"with --pairs and a generation adapter: the scale of the implicit reward (default {DEFAULT})",
    )
    evaluate.add_argument(
        "--max-sequence",
        metavar="N",
        help="longest sequence in tokens, capped at the model's context; a longer example or pair is "
        f"skipped, never cut (default {DEFAULT})",
    )
    evaluate.add_argument("--batch-size", metavar="N", help=f"examples (or pairs) per forward pass (default {DEFAULT})")
    merge = _command(
        sub,
        "merge",
        "fold an adapter into a copy of the checkpoint",
        "Write an ordinary checkpoint directory whose weights include the adapter's update.",
        "tune merge",
    )
    merge.add_argument("--model", required=True, metavar="MODEL", help="the base checkpoint")
    merge.add_argument("--revision", metavar="REV", help="Hub branch, tag or commit")
    merge.add_argument("--device", metavar=_choices(DEVICES), help=f"(default {DEFAULT})")
    merge.add_argument("--adapter", required=True, metavar="FILE", help="the adapter to fold in")
    merge.add_argument("--output", required=True, metavar="DIR", help="a new or empty directory")
    inspect = _command(
        sub,
        "inspect",
        "print an adapter's sidecar and tensor shapes; no model",
        "Validate an adapter's sidecar and list every tensor's name and shape without loading a model.",
        "tune inspect",
    )
    inspect.add_argument("artifact", metavar="ADAPTER", help="the adapter's .safetensors file")
    export = _command(
        sub,
        "export-peft",
        "write an adapter as a PEFT directory",
        "Write the adapter as adapter_config.json and adapter_model.safetensors, which "
        "peft.PeftModel.from_pretrained loads on the Hugging Face checkpoint.",
        "tune export-peft",
    )
    export.add_argument("adapter", metavar="ADAPTER", help="the adapter's .safetensors file")
    export.add_argument("--output", required=True, metavar="DIR", help="a new or empty directory")
    export.add_argument(
        "--base-model", metavar="NAME", help="the base model the PEFT config names (default: the adapter's model)"
    )


def _remote_flags(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--server",
        metavar="URL",
        default=default,
        help="run the job on a ster serve server at URL (such as http://127.0.0.1:8765) instead of "
        "in this process; paths name files on the server",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=default,
        help="a file holding the server's bearer token (default: the STER_TOKEN environment variable, if set)",
    )


def _add_serve(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve every job over HTTP, streamed as NDJSON",
        description="Serve every job at POST /v1/<operation> (train, tune/sft, pairs/inspect, ...), its body the "
        'command\'s flags in camelCase, streamed as NDJSON. Prints {"port":N,"ready":true} once it '
        "accepts connections. Loopback only unless --host says otherwise; a host that is not loopback "
        "requires a bearer token and --root. It also speaks OpenAI's API (POST /v1/chat/completions, "
        "/v1/completions, GET /v1/models) with a steering field per request, every request's rows decoded as "
        "one continuous batch. The API is described at /docs.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", default="0", metavar="N", help="the port, 0 to 65535; 0 takes a free one (default 0)")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file whose first line is the bearer token every request must carry (default: the "
        "STER_SERVE_TOKEN environment variable, if set); required off loopback",
    )
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="confine every path a request names to DIR, and take relative paths from it; required off loopback",
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="M",
        help="load model M (a checkpoint directory, a Hub id or a ster: name) at start for the OpenAI endpoints; "
        "repeat for more. A request may also name any other bundled model or a path under --root",
    )


def _add_request(commands: Any) -> None:
    parser = commands.add_parser(
        "request",
        help="run one operation from a JSON body on stdin, printing NDJSON",
        description="Read one JSON body on stdin (the command's flags in camelCase; blank means {}), run the "
        "operation, and print the lines ster serve streams. Exit 0 done, 1 failed while running, "
        "2 refused before running, 130 cancelled with Ctrl-C.",
    )
    parser.add_argument(
        "operation",
        metavar="OPERATION",
        help="train, optimize, evaluate, generate, extract, inspect, sweep, pairs/inspect, pairs/save, "
        "pairs/synthesize, workspace/import-pairs, workspace/show, tune/sft, tune/dpo, "
        "tune/reward, tune/grpo, tune/merge, tune/evaluate, tune/inspect, ...",
    )


STEERING = (
    _add_train,
    _add_optimize,
    _add_evaluate,
    _add_generate,
    _add_extract,
    _add_sweep,
    _add_calibrate,
    _add_bake,
    _add_inspect,
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. Building it imports nothing beyond the standard library."""
    parser = CommandParser(
        prog="ster",
        description="Read hidden states out of causal language models, fit steering directions from contrastive "
        "pairs, and steer generation with them. Run ster alone on a terminal for the full-screen app.",
        epilog=f'Try: ster generate --model {EXAMPLE_MODEL} --prompt "question : what is the river like ? answer :"',
    )
    parser.add_argument("--version", action="version", version=f"ster {__version__}")
    parser.add_argument("--json", action="store_true", help="print every event as one JSON object per line on stdout")
    _remote_flags(parser)
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    for add in STEERING:
        add(commands)
    vector = commands.add_parser("vector", help="the steering commands again, as ster vector <command>")
    vector_commands = vector.add_subparsers(dest="vector_command", metavar="<command>", required=True)
    for add in STEERING:
        add(vector_commands)
    _add_vector_import(vector_commands)
    tui = commands.add_parser(
        "tui",
        help="open the full-screen app (also: ster with no arguments on a terminal)",
        description="The full-screen app: author pairs, train and select a direction, "
        "compare steered with unsteered generation.",
    )
    tui.add_argument("--model", default="ster:toy", help="the model to start with (default ster:toy)")
    tui.add_argument("--pairs", metavar="FILE", help="the pair set to open")
    _remote_flags(tui, suppress=True)
    _add_pairs(commands)
    _add_workspace(commands)
    _add_onboarding(commands)
    _add_model(commands)
    _add_tune(commands)
    _add_serve(commands)
    _add_request(commands)
    return parser
