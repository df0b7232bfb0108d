"""The own-code check's passes, remembered: a run whose inputs all equal a passed check's does
not start the check's child again.

The first task's child (`stratoflow.training.own_code_check`) imports TensorFlow and Keras (5-15
s of CPU) to prepare the dataset, stream its statistics and run the pipeline's code on two
examples; on a prepared dataset, that import is nearly all of its cost. A scheduled run, a retry
or a second run of the same pipeline checks the same things again. So a passed check's result
(the dataset's reference and its statistics) is kept under a key made of everything the check
reads:

- the resolved spec, whole (the run's Params applied): model builder, hyperparameters,
  optimizer, preprocessing, splits, slices, seed, ...;
- the code fingerprint (`stratoflow.tracking.fingerprints.code_fingerprint`): every file of the
  pipeline's folder and of the engine's model-shaping packages (`stratoflow.config`, `.data`,
  `.training`, which hold the check itself);
- the prepared dataset's files (name, size and modification time of every file in its variant
  folder, as the dataset fingerprint's own cache keys them) and the TFDS data dir;
- the versions of TensorFlow, Keras, TFDS and NumPy, and the Python version.

Any difference is a miss, and the child runs as before. Not keyed: what the pipeline's code
reads from outside its folder (a file elsewhere, an environment variable); such a pipeline is
checked again once its folder, its spec or its data change. A refusal is never kept: a mistake is
refused again, from the child, before any MLflow run. Not kept either, so always checked: a
dataset read in place from an image folder (its images are not hashed), one not prepared yet, and
a pipeline without a folder of its own. The results live under the state folder
(`<state>/own-code-checks/`, owner-only like the rest of it); whoever can write there can already
change the runs' data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from stratoflow.config import locations
from stratoflow.config.spec import PipelineSpec

logger = logging.getLogger(__name__)

# Bumped when what a kept result holds, or what the key covers, changes.
SCHEME = "own-code-check/1"
FOLDER = "own-code-checks"
# The distributions whose versions may change what the check finds.
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "keras", "tensorflow-datasets", "numpy")


def cache_key(spec: PipelineSpec) -> str | None:
    """The key of a check of `spec` (sha256 hex), or None when such a check is not kept.

    None for a dataset read from an image folder, a dataset not prepared in the data dir, and a
    spec without a pipeline folder.
    """
    from stratoflow.tracking.fingerprints import code_fingerprint

    dataset = spec.dataset
    if dataset.image_folder is not None or not spec.folder:
        return None
    data_dir = locations.data_dir()
    variant = data_dir / dataset.name
    if dataset.config:
        variant /= dataset.config
    variant /= dataset.version
    files = _file_stats(variant)
    if not files:
        return None
    identity = {
        "scheme": SCHEME,
        "spec": dataclasses.asdict(spec),
        "code": code_fingerprint(Path(spec.folder)),
        "data_dir": str(data_dir),
        "dataset_files": files,
        "versions": {name: _version(name) for name in _DISTRIBUTIONS},
        "python": platform.python_version(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def recall(key: str) -> dict[str, Any] | None:
    """The result a passed check with `key` left (`own_code_check`'s child result), or None."""
    path = _path(key)
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("scheme") != SCHEME:
        return None
    result = kept.get("result")
    return result if isinstance(result, dict) else None


def remember(key: str, result: dict[str, Any]) -> None:
    """Keep a passed check's result under `key` (best effort: a failed write only costs the
    next run a check)."""
    path = _path(key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"scheme": SCHEME, "result": result}))
        os.replace(temporary, path)


def _path(key: str) -> Path:
    return locations.state_dir() / FOLDER / f"{key}.json"


def _file_stats(variant: Path) -> list[list[Any]]:
    """[relative path, size, mtime_ns] of every file of a prepared variant (none: not
    prepared); stratoflow's own files in it (the fingerprint's cache) left out."""
    if not variant.is_dir():
        return []
    stats = []
    for path in sorted(variant.rglob("*")):
        if path.is_file() and not path.name.startswith(".stratoflow-"):
            stat = path.stat()
            stats.append([path.relative_to(variant).as_posix(), stat.st_size, stat.st_mtime_ns])
    return stats


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
