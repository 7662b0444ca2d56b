"""Where a ``--model`` string points: the bundled toy, a local directory, or a Hub repository.

Resolution reads directory listings and config.json only. It refuses the wrong
family and a missing file before any weight is opened, and it records the model's
identity — the string as given, and the resolved Hub commit (for a local directory,
the ``--revision`` given, if any, recorded with a warning) — which is what every
artifact stores.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ster.engine.model.config import check_model_type
from ster.engine.protocol import confine
from ster.engine.protocol.errors import Refusal
from ster.engine.protocol.files import read_json
from ster.engine.protocol.naming import flag
from ster.engine.protocol.paths import DATA_DIR, EXAMPLES_DIR, PREFIX

TOY_DIR = DATA_DIR / "toy"
RESERVED = {
    "ster:toy": (TOY_DIR, None),
    "ster:toy-chat": (TOY_DIR, EXAMPLES_DIR / "chat-template" / "tokenizer_config.json"),
}
"""Reserved model names: the bundled toy checkpoint, and the same weights with the
example chat template written in the toy's own vocabulary. The example files' reserved
names (``ster:pairs``, ...) are in :mod:`ster.engine.protocol.paths`."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "*.safetensors",
    "model.safetensors.index.json",
]


@dataclass(frozen=True)
class ModelSource:
    """The files of one checkpoint, found and checked, and the identity artifacts record."""

    model: str
    """The ``--model`` string exactly as given."""
    revision: str | None
    """The resolved Hub commit; for a local directory or the bundled toy, the ``--revision`` given
    (recorded, not checked), else None."""
    root: Path
    config: Path
    tokenizer: Path
    tokenizer_config: Path | None
    chat_template_file: Path | None
    generation_config: Path | None
    weights: tuple[Path, ...]
    warning: str | None = None
    """A sentence the job that opens this checkpoint emits as a warning (a revision that was not checked)."""


def resolve_model(model: str, revision: str | None = None) -> ModelSource:
    """Find a checkpoint's files and check its family, refusing in one sentence."""
    if model in RESERVED:
        root, tokenizer_config = RESERVED[model]
        source = _from_directory(model, revision, root, tokenizer_config)
        return _unchecked_revision(source, "the bundled toy checkpoint")
    if model.startswith(PREFIX):
        names = ", ".join(RESERVED)
        raise Refusal(
            f"model {model} is not a bundled model; the bundled models are {names} (a directory "
            f"that really is called so is reached as ./{model})"
        )
    path = Path(model).expanduser()
    real = confine.readable(path)  # under a server's root: walked inside it, each file pinned
    if real.is_dir():
        return _unchecked_revision(_from_directory(model, revision, real, shown=path), "a local directory")
    if real.exists():
        raise Refusal(f"model {model} is a file; {flag('model')} takes a checkpoint directory or a Hub id")
    if confine.active():
        raise Refusal(
            f"model directory {model} does not exist inside the server's root; with a root a model is "
            "a directory inside it or a bundled ster: name"
        )
    if not _HUB_ID.match(model) or ".." in model:
        raise Refusal(f"model directory {model} does not exist")
    return _from_hub(model, revision)


def _unchecked_revision(source: ModelSource, what: str) -> ModelSource:
    """A revision given with a checkpoint that has none is kept as the record says, with a warning."""
    if source.revision is None:
        return source
    warning = (
        f"{flag('revision')} {source.revision} is recorded as model_revision but not checked: {source.model} is "
        f"{what}, not a Hub repository"
    )
    return replace(source, warning=warning)


def _from_directory(
    model: str, revision: str | None, root: Path, tokenizer_config: Path | None = None, shown: Path | None = None
) -> ModelSource:
    """The checkpoint in ``root``; sentences name it as ``shown`` (the path as given, where ``root`` is
    the pinned copy a server's root reads through)."""
    shown = shown or root
    config = _required(root, "config.json", shown)
    check_model_type(config, f"{shown / 'config.json'}")
    tokenizer = _required(root, "tokenizer.json", shown)
    if tokenizer_config is None and (root / "tokenizer_config.json").is_file():
        tokenizer_config = root / "tokenizer_config.json"
    return ModelSource(
        model=model,
        revision=revision,
        root=root,
        config=config,
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config,
        chat_template_file=_optional(root, "chat_template.jinja"),
        generation_config=_optional(root, "generation_config.json"),
        weights=_weight_files(root, shown),
    )


def _required(root: Path, name: str, shown: Path) -> Path:
    path = root / name
    if not path.is_file():
        raise Refusal(f"model directory {shown} has no {name}")
    return path


def _optional(root: Path, name: str) -> Path | None:
    path = root / name
    return path if path.is_file() else None


def _weight_files(root: Path, shown: Path) -> tuple[Path, ...]:
    """The safetensors files holding the weights: the index's shards, one file, or all of them."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Refusal(f"weight index {shown / index.name} has no weight_map")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not isinstance(shard, str) or "/" in shard or shard in ("", ".", "..") or not (root / shard).is_file():
                raise Refusal(f"model directory {shown} has no {shard}, a shard named by {index.name}")
        return tuple(root / shard for shard in shards)
    single = root / "model.safetensors"
    if single.is_file():
        return (single,)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise Refusal(f"model directory {shown} has no *.safetensors weights")
    return tuple(files)


def _from_hub(repo_id: str, revision: str | None) -> ModelSource:
    """Resolve through the standard Hugging Face cache, which honours HF_HOME, HF_HUB_CACHE,
    HF_ENDPOINT and HF_HUB_OFFLINE. config.json comes first, so a wrong family is refused
    before the weights are fetched."""
    import huggingface_hub
    import huggingface_hub.utils

    huggingface_hub.utils.disable_progress_bars()
    with hub_errors(repo_id, revision):
        config = Path(huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision))
        check_model_type(config, f"{repo_id} config.json")
        snapshot = Path(huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_FILES))
    return _from_directory(repo_id, snapshot.name, snapshot)


@contextmanager
def hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-sentence refusals."""
    from huggingface_hub import constants, errors

    where = repo_id if revision is None else f"{repo_id} at revision {revision}"
    try:
        yield
    except errors.GatedRepoError:
        raise Refusal(f"model {repo_id} is gated on the Hugging Face Hub; accept its terms there and log in") from None
    except errors.RepositoryNotFoundError:
        raise Refusal(f"model {repo_id} is not a local directory and was not found on the Hugging Face Hub") from None
    except errors.RevisionNotFoundError:
        raise Refusal(f"revision {revision} was not found in {repo_id} on the Hugging Face Hub") from None
    except errors.LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise Refusal(
                f"model {where} is not a local directory and is not in the Hugging Face cache at "
                f"{constants.HF_HUB_CACHE}, and HF_HUB_OFFLINE forbids downloading it"
            ) from None
        raise Refusal(
            f"model {where} is not a local directory, is not in the Hugging Face cache at "
            f"{constants.HF_HUB_CACHE}, and {constants.ENDPOINT} could not be reached"
        ) from None
    except errors.EntryNotFoundError:
        raise Refusal(f"model {where} has no config.json on the Hugging Face Hub") from None
    except OSError as exc:
        raise Refusal(f"model {where} could not be fetched from the Hugging Face Hub: {exc}") from None
