"""What a model was made from, as three fingerprints: its data, its code and its configuration.

Every retrain run records them as tags of its MLflow run (`stratoflow.fingerprint.*`). A
scheduled or asset-triggered run whose three fingerprints equal its champion's has nothing new
to learn from: it skips training (`unchanged_since_champion`), unless its `force` setting says
otherwise. A manual run always trains.

- dataset: the TFDS name, config and version, and the prepared files' content hash
  (`stratoflow.data.datasets.fingerprint`, computed once and cached beside the files).
- code: sha256 over the pipeline folder's files (its own dataset builder, model, preprocessing;
  not `pipeline.yaml`, whose model-shaping part is the configuration's) and over the engine's
  packages that shape a model (`stratoflow.config`, `stratoflow.data`, `stratoflow.training`).
- config: sha256 over the resolved spec (the run's Params applied) without the fields that do
  not change the model (`MODEL_NEUTRAL_KEYS`, `MODEL_NEUTRAL_TRAINING_KEYS`). A field missing
  from these lists makes a run train when it could have skipped, never the other way round.

Light: no TensorFlow, no MLflow at import (the champion's tags are read with a client made when
called).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratoflow.config import discovery
from stratoflow.config.spec import PipelineSpec

TAG_PREFIX = "stratoflow.fingerprint."

# Spec keys that change what is said about a model, or when and where it runs, not the model.
# `validation`, `promotion` and `notify` are listed ahead of the gates and the notification
# settings that use them: a gate decides about a model, it does not make one.
MODEL_NEUTRAL_KEYS = frozenset(
    {
        "name",
        "description",
        "evaluation",
        "registered_model",
        "schedule",
        "owner",
        "tags",
        "retries",
        "retry_delay_seconds",
        "folder",
        "validation",
        "promotion",
        "notify",
    }
)
# Training settings that choose where the processes run and how a lost one is recovered, or
# what happens after training. Strategy, replicas, workers, ps and the loop stay in: they change
# the summation order, and so the weights (DESIGN.md, "Distributed training facts").
WHERE_KEYS = {"cluster", "launcher", "ray_cluster", "placement"}
RECOVERY_KEYS = {"max_restarts", "warm_spares"}
AFTER_TRAINING_KEYS = {"promote", "force"}
MODEL_NEUTRAL_TRAINING_KEYS = frozenset(WHERE_KEYS | RECOVERY_KEYS | AFTER_TRAINING_KEYS)

# The engine's packages whose code shapes a model (relative to the `stratoflow` package).
ENGINE_PACKAGES = ("config", "data", "training")
# Run types whose runs nobody asked for by hand: only they skip (values of Airflow's
# `DagRunType`, as `context["dag_run"].run_type` gives them).
UNATTENDED_RUN_TYPES = frozenset({"scheduled", "asset_triggered"})


@dataclass(frozen=True)
class Fingerprints:
    """The three fingerprints of a run (sha256 hex digests).

    Attributes:
        dataset: the prepared dataset (name, config, version, files' content).
        code: the pipeline's own code and the engine's model-shaping code.
        config: the resolved configuration, without the fields that do not change the model.
    """

    dataset: str
    code: str
    config: str

    def tags(self) -> dict[str, str]:
        """The MLflow tags that record them: `stratoflow.fingerprint.<part>`."""
        return {TAG_PREFIX + f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Fingerprints | None:
        """The fingerprints a run's tags record, or None when any is missing (an older run)."""
        values = {f.name: tags.get(TAG_PREFIX + f.name) for f in dataclasses.fields(cls)}
        if any(not value for value in values.values()):
            return None
        return cls(**{name: str(value) for name, value in values.items()})

    def differences(self, other: Fingerprints) -> list[str]:
        """The parts (`dataset`, `code`, `config`) whose fingerprints differ from `other`'s."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


def of_run(spec: PipelineSpec, dataset: Mapping[str, Any]) -> Fingerprints:
    """The fingerprints of a run of `spec` (its Params applied) on the prepared `dataset`.

    Args:
        spec: the run's resolved spec (a `RunPlan`'s).
        dataset: the prepared dataset's reference as a dict (`DatasetRef.to_dict`).
    """
    return Fingerprints(
        dataset=dataset_fingerprint(dataset),
        code=code_fingerprint(Path(spec.folder) if spec.folder else None),
        config=config_fingerprint(spec),
    )


def dataset_fingerprint(dataset: Mapping[str, Any]) -> str:
    """sha256 over the dataset's name, config, version and content fingerprint."""
    identity = [dataset["name"], dataset.get("config"), dataset["version"], dataset["fingerprint"]]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def code_fingerprint(pipeline_folder: Path | None) -> str:
    """sha256 over the pipeline folder's files (but `pipeline.yaml`) and the engine's code."""
    import stratoflow

    engine = Path(stratoflow.__file__).parent
    digest = hashlib.sha256()
    _hash_files(digest, "engine", engine, [engine / package for package in ENGINE_PACKAGES])
    if pipeline_folder is not None:
        _hash_files(digest, "pipeline", pipeline_folder, [pipeline_folder])
    return digest.hexdigest()


def _hash_files(digest: Any, label: str, root: Path, folders: Iterable[Path]) -> None:
    files = sorted(
        path
        for folder in folders
        for path in folder.rglob("*")
        if path.is_file() and _is_source(path.relative_to(root))
    )
    for path in files:
        digest.update(f"{label}/{path.relative_to(root).as_posix()}\0".encode())
        content = path.read_bytes()
        digest.update(f"{len(content)}\0".encode())
        digest.update(content)


def _is_source(relative: Path) -> bool:
    """Not a cache, a hidden file or the spec (whose model-shaping part the config hashes)."""
    if relative.as_posix() == discovery.PIPELINE_FILE:
        return False
    if any(part == "__pycache__" or part.startswith(".") for part in relative.parts):
        return False
    return relative.suffix not in (".pyc", ".pyo")


def config_fingerprint(spec: PipelineSpec) -> str:
    """sha256 over the resolved spec without its model-neutral keys, as canonical JSON."""
    config = {
        key: value
        for key, value in dataclasses.asdict(spec).items()
        if key not in MODEL_NEUTRAL_KEYS
    }
    config["training"] = {
        key: value
        for key, value in config["training"].items()
        if key not in MODEL_NEUTRAL_TRAINING_KEYS
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def may_skip(run_type: str, force: bool) -> bool:
    """Whether a run of `run_type` may skip training at all: unattended and not forced."""
    return run_type in UNATTENDED_RUN_TYPES and not force


def champion_fingerprints(model_name: str) -> tuple[str, Fingerprints | None] | None:
    """The champion's version and the fingerprints its run recorded (None: it recorded none),
    or None when `model_name` has no champion."""
    from stratoflow.config import names
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client()
    try:
        version = mlflow_client.get_model_version_by_alias(model_name, names.CHAMPION)
    except Exception:  # no such model or no such alias
        return None
    run = mlflow_client.get_run(version.run_id)
    return str(version.version), Fingerprints.from_tags(run.data.tags)


def unchanged_since_champion(model_name: str, current: Fingerprints) -> str | None:
    """Why a run with fingerprints `current` has nothing to train, or None when it has.

    Returns:
        A sentence naming the champion's version when its dataset, code and configuration
        fingerprints all equal `current`'s; None when there is no champion, its run recorded no
        fingerprints, or any part differs.
    """
    found = champion_fingerprints(model_name)
    if found is None:
        return None
    version, recorded = found
    if recorded is None or current.differences(recorded):
        return None
    return (
        f"nothing new since the champion, {model_name} version {version}: same dataset "
        f"({current.dataset[:12]}), pipeline code ({current.code[:12]}) and training "
        f"configuration ({current.config[:12]})"
    )
