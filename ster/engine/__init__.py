"""The engine: everything that touches models and files, in five parts.

* ``protocol`` — the job protocol every front end consumes: events, jobs and their
  registry, errors and exit codes, request checks, and the one place that reads and
  writes files. It imports no other part.
* ``model`` — a checkpoint: resolution, config, tokenizer and chat template, loading,
  Ster's own decoder and the path through transformers for other families, decoding,
  LoRA adapters, GGUF import, the bundled toy.
* ``pairs`` — contrastive pair sets: the document, editing, inspection, synthesis, the
  workspace of kept sets, and first use.
* ``steering`` — reading hidden states, fitting and judging directions, the steering
  artifact, applying a direction, sweeps, calibration, extraction and steered generation.
* ``tune`` — LoRA training: the data, the loop every objective shares (sft, dpo, reward,
  grpo), checkpoints, data parallel runs, evaluation, merging and PEFT export.

Each part imports only the parts listed before it (tested in
``tests/protocol/test_layout.py``), and each keeps its requests in its own
``requests.py``. Nothing here imports the TUI, and importing a package is cheap: torch
and transformers are imported by the modules that need them, which the jobs import only
when they run.
"""
