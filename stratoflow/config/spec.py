"""Pipeline specs: one YAML file per pipeline in `pipelines/`, loaded into typed dataclasses.

A spec declares the dataset, the model, the training defaults, the evaluation gate, the schedule
and the registered-model name. Loading validates every key and type and names the offending
field, so a typo fails at DAG parse time with a message, not in the middle of a weekly retrain.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from stratoflow.config.options import LOOPS, PS_CHOICES, REPLICA_CHOICES, STRATEGIES, WORKER_CHOICES

# The `pipelines` package holds the pipeline definitions and no code: located, never imported.
SPECS_DIR = Path(str(resources.files("pipelines")))


class SpecError(ValueError):
    """A pipeline spec or a run's overrides are invalid; the message names the field."""


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
    """Which model builder (see `stratoflow.training.models.MODEL_BUILDERS`) and its
    hyperparameters."""

    builder: str
    hyperparameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingConfig:
    """Training settings; every field is also a DAG Param a trigger can override.

    Attributes:
        strategy: a name from `stratoflow.config.options.STRATEGIES`.
        replicas: replicas for `mirrored`/`central_storage` on a CPU-only host (logical CPUs).
        workers: worker processes for `multi_worker_mirrored` and `parameter_server`.
        ps: parameter-server processes for `parameter_server`.
        cluster: standing servers for `parameter_server`, as JSON
            `{"worker": ["host:port", ...], "ps": ["host:port", ...]}` (run with
            `stratoflow serve`); empty (null in a run's overrides): this task launches local
            ones (or `$STRATOFLOW_CLUSTER`).
        loop: "custom" (stratoflow's loop) or "fit" (Keras model.fit).
        epochs: passes over the training split.
        batch_size: the global batch, split across replicas.
        learning_rate: Adam's learning rate.
        seed: seeds weights, shuffling and dropout; same seed, same result.
        promote: move the `champion` alias when the evaluation gate passes.
    """

    strategy: str = "one_device"
    replicas: int = 2
    workers: int = 2
    ps: int = 1
    cluster: str = ""
    loop: str = "custom"
    epochs: int = 5
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 42
    promote: bool = True


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
    spec = _build(PipelineSpec, {"name": name, **_require_mapping(data, source)}, source)
    _check_values(spec, source)
    return spec


def _check_values(spec: PipelineSpec, source: str) -> None:
    from stratoflow.training.models import (
        MODEL_BUILDERS,  # light: builders import Keras only when called
    )

    if spec.model.builder not in MODEL_BUILDERS:
        raise SpecError(
            f"{source}: model.builder {spec.model.builder!r} is not a known model builder; "
            f"allowed: {', '.join(sorted(MODEL_BUILDERS))}"
        )
    missing = {"train", "validation", "test"} - set(spec.dataset.splits)
    if missing:
        raise SpecError(f"{source}: dataset.splits lacks {', '.join(sorted(missing))}")
    check_training(spec.training, source + ": training")
    check_model_strategy(spec, source + ": training")
    if not 0.0 <= spec.evaluation.min_accuracy <= 1.0:
        raise SpecError(f"{source}: evaluation.min_accuracy must be within [0, 1]")
    if spec.evaluation.max_regression < 0:
        raise SpecError(f"{source}: evaluation.max_regression must be >= 0")


def check_training(training: TrainingConfig, where: str = "training") -> None:
    """Validate values and combinations of a training config (also used on run overrides)."""
    if training.strategy not in STRATEGIES:
        raise SpecError(
            f"{where}.strategy {training.strategy!r} is not allowed; "
            f"allowed: {', '.join(STRATEGIES)}"
        )
    if training.loop not in LOOPS:
        raise SpecError(
            f"{where}.loop {training.loop!r} is not allowed; allowed: {', '.join(LOOPS)}"
        )
    if training.replicas not in REPLICA_CHOICES:
        raise SpecError(
            f"{where}.replicas {training.replicas!r} is not allowed; "
            f"allowed: {', '.join(map(str, REPLICA_CHOICES))}"
        )
    for key, choices in (("workers", WORKER_CHOICES), ("ps", PS_CHOICES)):
        if getattr(training, key) not in choices:
            raise SpecError(
                f"{where}.{key} {getattr(training, key)!r} is not allowed; "
                f"allowed: {', '.join(map(str, choices))}"
            )
    if training.cluster:
        parse_cluster(training.cluster, f"{where}.cluster")
        if training.strategy != "parameter_server":
            raise SpecError(
                f"{where}.cluster (standing servers) applies to strategy 'parameter_server' only; "
                "multi_worker_mirrored across hosts runs the worker entrypoint on every host "
                "with its TF_CONFIG (README: Several machines)"
            )
    if training.loop == "fit" and not STRATEGIES[training.strategy].supports_fit:
        fit_ok = [name for name, traits in STRATEGIES.items() if traits.supports_fit]
        raise SpecError(
            f"{where}.loop 'fit' does not work with strategy {training.strategy!r} in Keras 3; "
            f"use loop 'custom', or one of the strategies fit supports: {', '.join(fit_ok)}"
        )
    for key in ("epochs", "batch_size"):
        if getattr(training, key) < 1:
            raise SpecError(f"{where}.{key} must be >= 1, got {getattr(training, key)}")
    if not 0 < training.learning_rate <= 1:
        raise SpecError(
            f"{where}.learning_rate must be within (0, 1], got {training.learning_rate}"
        )
    if STRATEGIES[training.strategy].uses_replicas and training.batch_size % training.replicas:
        raise SpecError(
            f"{where}.batch_size {training.batch_size} must be divisible by replicas "
            f"{training.replicas}: the global batch is split evenly across replicas"
        )
    if training.strategy == "multi_worker_mirrored" and training.batch_size % training.workers:
        raise SpecError(
            f"{where}.batch_size {training.batch_size} must be divisible by workers "
            f"{training.workers}: the global batch is split evenly across workers"
        )


def check_model_strategy(spec: PipelineSpec, where: str = "training") -> None:
    """Refuse a strategy that cannot train the spec's model, from the spec alone (no TensorFlow).

    `central_storage` fails on layers that draw random numbers; a bundled builder has Dropout
    exactly when its `dropout` hyperparameter is non-zero
    (`stratoflow.training.models.has_random_layers`).
    """
    from stratoflow.training.models import (
        has_random_layers,  # light: Keras is imported only by the builders
    )

    training = spec.training
    if training.strategy == "central_storage" and has_random_layers(
        spec.model.builder, spec.model.hyperparameters
    ):
        raise SpecError(
            f"{where}.strategy 'central_storage' cannot train model {spec.model.builder!r}: it "
            f"has Dropout (model.hyperparameters.dropout "
            f"{spec.model.hyperparameters.get('dropout')}), and TensorFlow's CentralStorage fails "
            "on layers that draw random numbers; choose another strategy, e.g. 'mirrored'"
        )


def parse_cluster(text: str, where: str = "cluster") -> dict[str, list[str]]:
    """Parse and check a standing cluster spec: JSON with `worker` and `ps` lists of host:port."""
    try:
        jobs = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecError(f"{where} is not valid JSON: {error}") from None
    if not isinstance(jobs, dict) or not jobs.get("worker") or not jobs.get("ps"):
        raise SpecError(
            f'{where} must be a JSON object like {{"worker": ["host:port"], "ps": ["host:port"]}}'
        )
    for job, addresses in jobs.items():
        if job not in ("worker", "ps"):
            raise SpecError(f"{where}: unknown job {job!r}; allowed: worker, ps")
        for address in addresses if isinstance(addresses, list) else [addresses]:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                raise SpecError(f"{where}: {job} address {address!r} is not host:port")
    return {job: list(addresses) for job, addresses in jobs.items()}


def override_training(training: TrainingConfig, overrides: dict[str, Any]) -> TrainingConfig:
    """Return `training` with a run's overrides (DAG Params / CLI flags) applied and validated."""
    merged = {**dataclasses.asdict(training), **overrides}
    if merged["cluster"] is None:
        merged["cluster"] = ""  # the Param's default and a cleared form field: no standing cluster
    result = _build(TrainingConfig, merged, "run conf")
    check_training(result, "run conf")
    return result


def override_spec(spec: PipelineSpec, overrides: dict[str, Any]) -> PipelineSpec:
    """Return `spec` with a run's training overrides applied and the whole run validated.

    Everything decided by the spec and the run conf alone is checked here, so that a run the
    spec refuses fails before any work (the same answer on every try).

    Raises:
        SpecError: an invalid value or combination (named in the message).
    """
    result = dataclasses.replace(spec, training=override_training(spec.training, overrides))
    check_model_strategy(result, "run conf")
    return result


def _require_mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data


def _build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass `cls` from `data`, checking keys and types recursively."""
    data = _require_mapping(data, where)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    values = {}
    for key, f in fields.items():
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{where}: missing required key {key!r}")
            continue
        values[key] = _coerce(hints[key], data[key], f"{where}.{key}".replace(": .", ": "))
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (hint,) = [option for option in options if option is not type(None)]
        origin = typing.get_origin(hint)
    if origin is dict:
        return dict(_require_mapping(value, where))
    if origin is list:
        if not isinstance(value, list):
            raise SpecError(f"{where}: expected a list, got {type(value).__name__}")
        return list(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{where}: expected a finite number, got {value!r}")
    if hint is Any:
        return value
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise SpecError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
