"""heretic-llm's own trial, timed: run with heretic's venv, not Ster's (heretic is a benchmark peer only).

Loads the model once through heretic's ``Model`` (LoRA adapters on every abliterable module, as heretic
does), computes heretic's per-layer refusal directions from the harmless and harmful prompts that are not
evaluated, builds heretic's ``Evaluator`` (the unsteered first-token distributions of the harmless evaluation
prompts, the unsteered refusal count of the harmful ones), and then runs trials exactly as heretic's
``objective`` does: parameters drawn by the same optuna sampler over the same ranges, ``reset_model``,
``abliterate``, and ``Evaluator.get_score`` (first-token KL over the harmless evaluation prompts, then a
greedy response of up to ``max_response_length`` tokens to every harmful evaluation prompt, counted as a
refusal or not). The first trial is a warm-up and is not timed. Prints one JSON object on the last line of
stdout (also written to ``--output`` when given).

    heretic-venv/bin/python bench/heretic_trial.py --model DIR --good harmless.txt --bad harmful.txt \
        --good-eval 8 --bad-eval 6 --trials 5 --threads 2

The prompt files hold one prompt a line; the first ``--good-eval`` / ``--bad-eval`` lines are the evaluation
prompts and the rest compute the refusal directions (heretic's train and test splits, here local files, as
heretic can load plain text files with a slice as their split).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from importlib.metadata import version
from os.path import commonprefix
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--good", type=Path, required=True, help="harmless prompts, one a line")
    parser.add_argument("--bad", type=Path, required=True, help="harmful prompts, one a line")
    parser.add_argument("--good-eval", type=int, default=8, help="harmless prompts KL is measured on")
    parser.add_argument("--bad-eval", type=int, default=6, help="harmful prompts refusals are counted on")
    parser.add_argument("--trials", type=int, default=5, help="timed trials, after one warm-up trial")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="heretic's batch_size (default: the larger evaluation set, so each is one batch)",
    )
    parser.add_argument("--max-response-length", type=int, default=None, help="heretic's default unless given")
    parser.add_argument(
        "--response-prefix",
        default=None,
        help="heretic's response_prefix; unless given, found as heretic finds it (an untimed check)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    model_path, good, bad = args.model.resolve(), args.good.resolve(), args.bad.resolve()
    output = args.output.resolve() if args.output else None
    sys.argv = sys.argv[:1]  # heretic's Settings parse the command line; give them none
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # and no config.toml from the working directory

    import optuna
    import torch
    import torch.nn.functional as F
    import transformers
    from heretic.config import DatasetSpecification, Settings
    from heretic.evaluator import Evaluator
    from heretic.model import AbliterationParameters, Model
    from heretic.utils import load_prompts
    from optuna.samplers import TPESampler
    from optuna.study import StudyDirection

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def spec(path: Path, split: str) -> DatasetSpecification:
        return DatasetSpecification(dataset=str(path), split=split)

    overrides = {} if args.max_response_length is None else {"max_response_length": args.max_response_length}
    settings = Settings(
        model=str(model_path),
        seed=args.seed,
        batch_size=args.batch_size or max(args.good_eval, args.bad_eval),
        good_prompts=spec(good, f"[{args.good_eval}:]"),
        bad_prompts=spec(bad, f"[{args.bad_eval}:]"),
        good_evaluation_prompts=spec(good, f"[:{args.good_eval}]"),
        bad_evaluation_prompts=spec(bad, f"[:{args.bad_eval}]"),
        **overrides,
    )
    started = time.perf_counter()
    model = Model(settings)
    loaded = time.perf_counter() - started
    good_prompts = load_prompts(settings, settings.good_prompts)
    bad_prompts = load_prompts(settings, settings.bad_prompts)

    if args.response_prefix is not None:
        settings.response_prefix = args.response_prefix
    else:  # heretic's response-prefix check, on the evaluation prompts (heretic takes up to 100 of each set)
        check = load_prompts(settings, settings.good_evaluation_prompts) + load_prompts(
            settings, settings.bad_evaluation_prompts
        )
        settings.response_prefix = commonprefix(model.get_responses_batched(check)).rstrip(" ")  # noqa: RUF071 - by character, as heretic does

    evaluator = Evaluator(settings, model)
    good_means = model.get_residuals_mean(good_prompts)
    bad_means = model.get_residuals_mean(bad_prompts)
    directions = F.normalize(bad_means - good_means, p=2, dim=1)
    if settings.orthogonalize_direction:
        good_directions = F.normalize(good_means, p=2, dim=1)
        projection = torch.sum(directions * good_directions, dim=1)
        directions = F.normalize(directions - projection.unsqueeze(1) * good_directions, p=2, dim=1)
    setup = time.perf_counter() - started - loaded

    parts: dict[str, float] = {}

    def timed(name: str, function):
        def wrapper(*a, **k):
            begin = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - begin

        return wrapper

    model.get_logprobs_batched = timed("kl", model.get_logprobs_batched)
    evaluator.count_refusals = timed("refusals", evaluator.count_refusals)
    last = len(model.get_layers()) - 1
    records: list[dict] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        """heretic's trial: its parameter ranges, reset, abliterate, score."""
        scope = trial.suggest_categorical("direction_scope", ["global", "per layer"])
        index: float | None = trial.suggest_float("direction_index", 0.4 * last, 0.9 * last)
        if scope == "per layer":
            index = None
        parameters = {}
        for component in model.get_abliterable_components():
            max_weight = trial.suggest_float(f"{component}.max_weight", 0.8, 1.5)
            position = trial.suggest_float(f"{component}.max_weight_position", 0.6 * last, 1.0 * last)
            min_weight = trial.suggest_float(f"{component}.min_weight", 0.0, 1.0)
            distance = trial.suggest_float(f"{component}.min_weight_distance", 1.0, 0.6 * last)
            parameters[component] = AbliterationParameters(
                max_weight=max_weight,
                max_weight_position=position,
                min_weight=min_weight * max_weight,
                min_weight_distance=distance,
            )
        parts.clear()
        begin = time.perf_counter()
        model.reset_model()
        model.abliterate(directions, index, parameters)
        abliterated = time.perf_counter()
        score, kl, refusals = evaluator.get_score()
        end = time.perf_counter()
        records.append(
            {
                "seconds": end - begin,
                "abliterate": abliterated - begin,
                "kl_seconds": parts.get("kl", 0.0),
                "refusal_seconds": parts.get("refusals", 0.0),
                "kl": kl,
                "refusals": refusals,
                "direction_index": index,
                "parameters": {k: asdict(v) for k, v in parameters.items()},
            }
        )
        return score

    study = optuna.create_study(
        sampler=TPESampler(
            n_startup_trials=settings.n_startup_trials, n_ei_candidates=128, multivariate=True, seed=settings.seed
        ),
        directions=[StudyDirection.MINIMIZE, StudyDirection.MINIMIZE],
    )
    study.optimize(objective, n_trials=args.trials + 1)
    timed_trials = records[1:]
    seconds = [r["seconds"] for r in timed_trials]
    result = {
        "heretic": version("heretic-llm"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(model.dtype).removeprefix("torch."),
        "batch_size": settings.batch_size,
        "max_response_length": settings.max_response_length,
        "response_prefix": settings.response_prefix,
        "good_eval": len(evaluator.good_prompts),
        "bad_eval": len(evaluator.bad_prompts),
        "good_direction": len(good_prompts),
        "bad_direction": len(bad_prompts),
        "base_refusals": evaluator.base_refusals,
        "load_seconds": loaded,
        "setup_seconds": setup,
        "warmup_seconds": records[0]["seconds"],
        "trials": timed_trials,
        "median_seconds": statistics.median(seconds),
        "mean_seconds": statistics.fmean(seconds),
        "median_abliterate": statistics.median(r["abliterate"] for r in timed_trials),
        "median_kl_seconds": statistics.median(r["kl_seconds"] for r in timed_trials),
        "median_refusal_seconds": statistics.median(r["refusal_seconds"] for r in timed_trials),
    }
    text = json.dumps(result)
    if output:
        output.write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
