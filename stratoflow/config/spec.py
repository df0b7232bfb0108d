"""Pipeline specs: one YAML file per pipeline in `pipelines/`, loaded into typed dataclasses.

A spec declares the dataset, the model, the training defaults, the evaluation gate, the schedule
and the registered-model name. Loading validates every key and type and names the offending
field, so a typo fails at DAG parse time with a message, not in the middle of a weekly retrain.
What depends on the model (a known builder, a strategy that can train it) is checked by
`stratoflow.training.validation`, which the DAG files and the first task call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from stratoflow.config.parsing import SpecError, build, require_mapping
from stratoflow.config.training import TrainingConfig, check_training

# The `pipelines` package holds the pipeline definitions and no code: located, never imported.
SPECS_DIR = Path(str(resources.files("pipelines")))


@dataclass(frozen=True)
class DatasetSpec:
    """Which TFDS dataset feeds the pipeline.

    Attributes:
        name: a registered TFDS builder name (stratoflow's offline builders included).
        version: the builder version to use, e.g. "1.0.0".
        config: the builder config name, if the builder has configs.
        splits: the TFDS split expression for each role: train, validation, test.
    """

    name: str
    version: str
    config: str | None = None
    splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "validation": "validation", "test": "test"}
    )


@dataclass(frozen=True)
class ModelSpec:
    """A model builder (`stratoflow.training.models.MODEL_BUILDERS`) and its hyperparameters."""

    builder: str
    hyperparameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluationGate:
    """When a new model may become champion.

    Attributes:
        min_accuracy: the test accuracy a model must reach.
        max_regression: how much lower than the current champion's test accuracy it may be.
    """

    min_accuracy: float
    max_regression: float = 0.0


@dataclass(frozen=True)
class PipelineSpec:
    """One retraining pipeline: everything its DAG and its tasks need to know."""

    name: str
    description: str
    dataset: DatasetSpec
    model: ModelSpec
    training: TrainingConfig
    evaluation: EvaluationGate
    registered_model: str
    schedule: str | None = None
    owner: str = "stratoflow"
    tags: list[str] = field(default_factory=list)
    retries: int = 2
    retry_delay_seconds: int = 60


def list_pipelines() -> list[str]:
    """Names of the pipelines shipped in `pipelines/`, sorted."""
    return sorted(path.stem for path in SPECS_DIR.glob("*.yaml"))


def load_spec(name: str) -> PipelineSpec:
    """Load and validate the spec of pipeline `name`.

    Raises:
        SpecError: no such pipeline, or the file has an unknown key, a wrong type or an
            invalid value; the message names the file and the field.
    """
    path = SPECS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise SpecError(f"unknown pipeline {name!r}; available: {', '.join(list_pipelines())}")
    return parse_spec(name, yaml.safe_load(path.read_text()) or {}, source=path.name)


def parse_spec(name: str, data: Any, source: str = "<spec>") -> PipelineSpec:
    """Build a validated `PipelineSpec` from a parsed YAML mapping."""
    spec = build(PipelineSpec, {"name": name, **require_mapping(data, source)}, source)
    _check_values(spec, source)
    return spec


def _check_values(spec: PipelineSpec, source: str) -> None:
    missing = {"train", "validation", "test"} - set(spec.dataset.splits)
    if missing:
        raise SpecError(f"{source}: dataset.splits lacks {', '.join(sorted(missing))}")
    check_training(spec.training, source + ": training")
    if not 0.0 <= spec.evaluation.min_accuracy <= 1.0:
        raise SpecError(f"{source}: evaluation.min_accuracy must be within [0, 1]")
    if spec.evaluation.max_regression < 0:
        raise SpecError(f"{source}: evaluation.max_regression must be >= 0")
