"""Pipeline specs: one folder per pipeline (`pipeline.yaml` + its own Python), loaded into
typed dataclasses.

A spec declares the dataset, the model, the objective (`task`, `optimizer`), the training
defaults, the evaluation gate, the schedule and the registered-model name. Loading validates every
key and type and names the file and the offending field, so a typo fails at DAG parse time with a
message, not in the middle of a weekly retrain. Where the pipelines are found is
`stratoflow.config.discovery`. What needs the pipeline's own code (its model builder's signature,
its dataset) is checked by `stratoflow.training.validation` in the run's first task: DAG parsing
never imports a pipeline's modules.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stratoflow.config import discovery
from stratoflow.config.evaluation_spec import EvaluationGate, checked_gate
from stratoflow.config.parsing import SpecError, build, require_mapping
from stratoflow.config.promotion import PromotionSpec, check_promotion
from stratoflow.config.training import TrainingConfig, check_training
from stratoflow.config.validation import ValidationSpec, check_validation

# Kept for callers that locate the bundled pipelines.
SPECS_DIR = discovery.BUNDLED_DIR

PROBLEM_TYPES = ("classification", "regression")
# Keras 3 optimizers by their `keras.optimizers.get` name.
OPTIMIZERS = (
    "adadelta",
    "adafactor",
    "adagrad",
    "adam",
    "adamax",
    "adamw",
    "ftrl",
    "lamb",
    "lion",
    "nadam",
    "rmsprop",
    "sgd",
)


@dataclass(frozen=True)
class DatasetSpec:
    """Which data feeds the pipeline: a TFDS dataset, from one of three sources.

    - a registered TFDS name (`name`, e.g. `mnist`, or stratoflow's bundled builders);
    - a TFDS builder in the pipeline's own code (`builder: "my_dataset:MyDataset"`): importing
      it registers the builder under `name` (TFDS's snake_case of the class name);
    - a folder of class-named image folders per split (`image_folder`), read with TFDS's
      `ImageFolder`: `<folder>/<split>/<class>/<image file>`, resized to `image_shape`.

    Attributes:
        name: the TFDS dataset name (for `image_folder`: the name its asset and runs show).
        version: the builder version to use, e.g. "1.0.0" (ignored for `image_folder`).
        config: the builder config name, if the builder has configs.
        splits: the TFDS split expression for each role: train, validation, test.
        builder: import path of a TFDS builder class (`module:Class`) in the pipeline folder or
            any importable module.
        image_folder: a folder of split folders of class folders of images; relative to the
            pipeline folder, or absolute.
        image_shape: `[height, width, channels]` of an `image_folder`'s images once decoded
            and resized (channels 1 or 3).
        preprocess: import path (`module:function`) of a `tf.data` map function applied to
            every `(features, target)` pair of every split, returning the new pair.
    """

    name: str
    version: str = "1.0.0"
    config: str | None = None
    splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "validation": "validation", "test": "test"}
    )
    builder: str | None = None
    image_folder: str | None = None
    image_shape: list[int] | None = None
    preprocess: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model builder and its hyperparameters.

    Attributes:
        builder: a bundled builder's name (`small_cnn`, `mlp`:
            `stratoflow.training.models.MODEL_BUILDERS`), or an import path `module:function`
            (a module in the pipeline folder, or any importable module). The function is called
            as `build(features, target, **hyperparameters)` and returns an uncompiled Keras 3
            model (see `stratoflow.config.features`).
        hyperparameters: keyword arguments of the builder; names checked against its signature
            before training.
    """

    builder: str
    hyperparameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineSpec:
    """One retraining pipeline: everything its DAG and its tasks need to know.

    Attributes:
        task: `classification` (integer class labels; cross-entropy, accuracy, confusion
            matrix) or `regression` (float targets; mean squared error, MAE, residual plot).
        optimizer: a Keras optimizer by name and its arguments, e.g. `{name: adamw,
            weight_decay: 0.004}`; the learning rate is `training.learning_rate` (a Param).
        promotion: whether a person approves each move of `champion` (`promotion.py`).
        folder: the pipeline's folder (set by `load_spec`, not written in the YAML): its own
            modules are imported from there.
        validation: the data gate before training (`stratoflow.config.validation`).
    """

    name: str
    description: str
    dataset: DatasetSpec
    model: ModelSpec
    training: TrainingConfig
    evaluation: EvaluationGate
    registered_model: str
    task: str = "classification"
    optimizer: dict[str, Any] = field(default_factory=lambda: {"name": "adam"})
    schedule: str | None = None
    owner: str = "stratoflow"
    tags: list[str] = field(default_factory=list)
    retries: int = 2
    retry_delay_seconds: int = 60
    promotion: PromotionSpec = field(default_factory=PromotionSpec)
    folder: str = ""
    validation: ValidationSpec = field(default_factory=ValidationSpec)

    @property
    def source(self) -> str:
        """The spec's file, as error messages name it."""
        return str(Path(self.folder) / discovery.PIPELINE_FILE) if self.folder else self.name


def list_pipelines() -> list[str]:
    """Names of the pipelines found (bundled and on `STRATOFLOW_PIPELINES_PATH`), sorted.

    A name with a discovery problem (two folders claim it, it is not a valid name) is left out:
    `pipeline_problems` says why.
    """
    return sorted(discovery.discover().folders)


def pipeline_problems() -> dict[str, str]:
    """Pipeline name (or path entry) → why it cannot load, for what discovery refused."""
    return discovery.discover().problems


def pipeline_folder(name: str) -> Path:
    """The folder of pipeline `name`.

    Raises:
        SpecError: no such pipeline, or discovery refused it (e.g. two folders claim the name).
    """
    found = discovery.discover()
    if name in found.problems:
        raise SpecError(found.problems[name])
    if name not in found.folders:
        raise SpecError(f"unknown pipeline {name!r}; available: {', '.join(sorted(found.folders))}")
    return found.folders[name]


def load_spec(name: str, *, check_settings: bool = True) -> PipelineSpec:
    """Load and validate the spec of pipeline `name` (its `pipeline.yaml`).

    Args:
        name: the pipeline.
        check_settings: False leaves the training defaults' values to the one check of a run's
            settings (`stratoflow.config.training.resolve_training`, which names this file when
            a default is at fault); their keys and types are checked all the same.

    Raises:
        SpecError: no such pipeline, or the file has an unknown key, a wrong type or an
            invalid value; the message names the file and the field.
    """
    folder = pipeline_folder(name)
    path = folder / discovery.PIPELINE_FILE
    try:
        data = _parsed_yaml(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: not readable YAML: {' '.join(str(error).split())}") from None
    data = require_mapping(data, str(path))
    if "folder" in data or "name" in data:
        key = "folder" if "folder" in data else "name"
        raise SpecError(
            f"{path}: unknown key {key!r} (the pipeline's name and folder are its folder's)"
        )
    return parse_spec(
        name, {**data, "folder": str(folder)}, source=str(path), check_settings=check_settings
    )


# libyaml's parser where PyYAML was built with it (the wheels are): a DAG parse reads every
# pipeline's file several times, and the pure-Python parser took 0.4 s of a 0.7 s parse.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parsed_yaml(text: str) -> Any:
    """`text` parsed as YAML (safe types only); a copy, so a caller may change it."""
    return copy.deepcopy(_parsed_yaml_once(text))


@functools.lru_cache(maxsize=64)
def _parsed_yaml_once(text: str) -> Any:
    # Keyed by the text itself: an edited file is parsed again, an unchanged one is not.
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


def parse_spec(
    name: str, data: Any, source: str = "<spec>", *, check_settings: bool = True
) -> PipelineSpec:
    """Build a validated `PipelineSpec` from a parsed YAML mapping (`check_settings`: as in
    `load_spec`)."""
    spec = build(PipelineSpec, {"name": name, **require_mapping(data, source)}, source)
    return _check_values(spec, source, check_settings)


def _check_values(spec: PipelineSpec, source: str, check_settings: bool = True) -> PipelineSpec:
    dataset = spec.dataset
    missing = {"train", "validation", "test"} - set(dataset.splits)
    if missing:
        raise SpecError(f"{source}: dataset.splits lacks {', '.join(sorted(missing))}")
    if dataset.builder is not None and dataset.image_folder is not None:
        raise SpecError(f"{source}: dataset.builder and dataset.image_folder exclude each other")
    if dataset.image_folder is not None:
        shape = dataset.image_shape
        if (
            not shape
            or len(shape) != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
            or shape[2] not in (1, 3)
        ):
            raise SpecError(
                f"{source}: dataset.image_shape must be [height, width, channels] (positive "
                f"integers, channels 1 or 3) for an image_folder; got {shape!r}"
            )
    elif dataset.image_shape is not None:
        raise SpecError(f"{source}: dataset.image_shape applies only to dataset.image_folder")
    for key, path in (
        ("dataset.builder", dataset.builder),
        ("dataset.preprocess", dataset.preprocess),
    ):
        if path is not None:
            check_import_path(path, f"{source}: {key}")
    if ":" in spec.model.builder:
        check_import_path(spec.model.builder, f"{source}: model.builder")
    if check_settings:
        check_training(spec.training, source + ": training")
    if spec.task not in PROBLEM_TYPES:
        raise SpecError(
            f"{source}: task {spec.task!r} is not allowed; allowed: {', '.join(PROBLEM_TYPES)}"
        )
    _check_optimizer(spec.optimizer, source)
    check_validation(spec.validation, source)
    check_promotion(spec.promotion, source)
    return dataclasses.replace(spec, evaluation=checked_gate(spec.evaluation, spec.task, source))


def check_import_path(path: str, where: str) -> None:
    """Refuse an import path that is not `module:attribute` (module dotted, both identifiers)."""
    module, _, attribute = path.partition(":")
    parts = [*module.split("."), attribute]
    if not attribute or not all(part.isidentifier() for part in parts):
        raise SpecError(
            f"{where}: {path!r} is not an import path; write 'module:name' (a module of the "
            "pipeline folder, e.g. 'model:build', or any importable module)"
        )


def _check_optimizer(optimizer: dict[str, Any], source: str) -> None:
    name = optimizer.get("name")
    if name not in OPTIMIZERS:
        raise SpecError(
            f"{source}: optimizer.name {name!r} is not allowed; allowed: {', '.join(OPTIMIZERS)}"
        )
    if "learning_rate" in optimizer:
        raise SpecError(
            f"{source}: optimizer.learning_rate: set training.learning_rate instead (a Param of "
            "every run)"
        )
