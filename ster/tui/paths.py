"""Where the app puts what it writes when the person names no file.

Artifacts go under the workspace's data directory (``$XDG_DATA_HOME/ster/artifacts``,
else ``~/.local/share/ster/artifacts``), beside the pair sets the workspace keeps, and
are named after the trait, the method and the model: a run on the toy never lands on
the file a run on a real model wrote, and nothing is written into whatever directory
the app was started from. The app still asks before it replaces an existing file.
"""

from __future__ import annotations

import re
from pathlib import Path


def artifact_dir() -> Path:
    from ster.engine.pairs.workspace import workspace_root

    return workspace_root() / "artifacts"


def slug(text: str) -> str:
    """A file-name-safe word: lower case, runs of anything but letters, digits, ``_`` and ``-`` become ``-``."""
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-") or "unnamed"


def model_word(model: str) -> str:
    """A model's short name: the last part of a path or Hub id; ``ster:toy`` keeps its prefix (``ster-toy``)."""
    return slug(model.rstrip("/").rsplit("/", 1)[-1])


def default_artifact(trait: str | None, method: str, model: str) -> Path:
    """``<trait>.<method>.<model>.ster.json`` in the artifact directory (method ``optimized`` for optimize)."""
    return artifact_dir() / f"{slug(trait or 'direction')}.{slug(method)}.{model_word(model)}.ster.json"


def shown(path: Path) -> str:
    """A path as the app shows it: under the home directory as ``~/…``."""
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)


def default_adapter(name: str | None, objective: str, model: str) -> Path:
    """``<name>.<objective>.<model>.safetensors`` in the artifact directory, for a run of the Tune tab;
    ``name`` is the trait of the pair set, or the data file's stem."""
    return artifact_dir() / f"{slug(name or 'adapter')}.{slug(objective)}.{model_word(model)}.safetensors"
