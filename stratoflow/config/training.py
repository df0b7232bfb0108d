"""A run's training settings: one dataclass whose field metadata is their single description.

Each field of `TrainingConfig` carries a `Setting` (title, help text, allowed values, bounds).
From it come, without a second list anywhere:

- the DAG Params' JSON schemas (`param_schemas`): Airflow refuses a bad trigger from the UI
  form, the REST API or the CLI before a DAG run exists, naming the field;
- the `stratoflow run` flags (`stratoflow.cli.main` reads the same metadata);
- the validation of a run's overrides (`resolve_training`), used by the CLI before Airflow
  starts and by the first task: the Params schemas first (Airflow's own messages), then the
  combinations a schema cannot express (`check_training`).

A spec's YAML defaults go through `check_training` too, so a typo in a spec fails at parse time.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stratoflow.config import clusters, extras
from stratoflow.config.options import (
    LAUNCHERS,
    LOOPS,
    PLACEMENTS,
    PS_CHOICES,
    REPLICA_CHOICES,
    WORKER_CHOICES,
)
from stratoflow.config.parsing import SpecError, build
from stratoflow.config.strategies import STRATEGIES, strategies_with

# Matches NaN, Infinity and -Infinity, and no finite number: a `not` of it refuses them. Bounds
# alone cannot (every comparison with NaN is false, so NaN passes `minimum` and `maximum`), and
# JSON schema cannot write infinity as a bound. Its title shows in the error message.
NOT_FINITE: dict[str, Any] = {
    "title": "NaN, Infinity or -Infinity",
    "anyOf": [{"exclusiveMinimum": sys.float_info.max}, {"exclusiveMaximum": -sys.float_info.max}],
}

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}

# Run settings that were renamed (CHANGELOG.md): the unknown key's error says what replaced it.
RENAMED = {"ray_address": "ray_cluster, the name of a Ray cluster of this deployment"}

# The default of `TrainingConfig.cache_budget_mb`: decoded examples held in memory, in MiB.
DEFAULT_CACHE_BUDGET_MB = 512


@dataclass(frozen=True)
class Setting:
    """How one training setting is shown and checked (the metadata of a `TrainingConfig` field).

    Attributes:
        title: the label of the trigger form's field.
        help: one or two sentences for the form, the CLI's `--help` and error messages.
        choices: the allowed values, each with its text in the form's dropdown; None: any value
            within the bounds.
        minimum: the smallest allowed value.
        maximum: the largest allowed value.
        above: values must be strictly greater than this.
        optional: null (and "") is allowed and means "not set".
        choices_from: where the allowed values come from when they are the deployment's, not
            the code's (read when the Params, flags or checks are made): the names of its
            clusters. Each value is shown as itself.
    """

    title: str
    help: str
    choices: Mapping[Any, str] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    optional: bool = False
    choices_from: Callable[[], Mapping[str, object]] | None = None

    def allowed(self) -> Mapping[Any, str] | None:
        """The allowed values with their display texts, or None: any value within the bounds."""
        if self.choices_from is not None:
            return {name: name for name in self.choices_from()}
        return self.choices


def _setting(default: Any, **metadata: Any) -> Any:
    return field(default=default, metadata={"setting": Setting(**metadata)})


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count > 1 else ''}"


@dataclass(frozen=True)
class TrainingConfig:
    """Training settings; every field is also a DAG Param and a `stratoflow run` flag.

    The fields' `Setting` metadata says what each one means and which values it takes.
    """

    strategy: str = _setting(
        "one_device",
        title="Distribution strategy",
        help="The tf.distribute strategy of this run.",
        choices={name: f"{name}: {traits.description}" for name, traits in STRATEGIES.items()},
    )
    replicas: int = _setting(
        2,
        title="Replicas",
        help="Replicas for `mirrored` and `central_storage` on a CPU-only host (logical CPU "
        "devices); the batch size must be divisible by it.",
        choices={n: _plural(n, "replica") for n in REPLICA_CHOICES},
    )
    workers: int = _setting(
        2,
        title="Workers",
        help="Worker processes for `multi_worker_mirrored` and `parameter_server`.",
        choices={n: _plural(n, "worker") for n in WORKER_CHOICES},
    )
    ps: int = _setting(
        1,
        title="Parameter servers",
        help="Parameter-server processes for `parameter_server`.",
        choices={n: _plural(n, "parameter server") for n in PS_CHOICES},
    )
    # Optional, so that the UI's trigger form accepts it empty: a required string whose default
    # is empty marks the form invalid and disables Trigger. A name, never an address: the
    # addresses are the deployment's (`stratoflow.config.clusters`).
    cluster: str = _setting(
        "",
        title="Standing cluster",
        help="parameter_server only: a standing cluster of this deployment (servers started "
        "with `stratoflow serve`), by name; empty or null: its cluster 'default' if it has one, "
        "else local processes.",
        optional=True,
        choices_from=clusters.standing_clusters,
    )
    launcher: str = _setting(
        "local",
        title="Launcher",
        help="Where the training processes run: on this task's host, or placed on a standing "
        "Ray cluster.",
        choices={name: f"{name}: {text}" for name, text in LAUNCHERS.items()},
    )
    # Optional and a name for the same reasons as `cluster`: the task presents the Ray token
    # to the address, so only the deployment chooses addresses.
    ray_cluster: str = _setting(
        "",
        title="Ray cluster",
        help="launcher 'ray' only: a Ray cluster of this deployment, by name; empty or null: "
        "its cluster 'default'.",
        optional=True,
        choices_from=clusters.ray_clusters,
    )
    placement: str = _setting(
        "pack",
        title="Placement",
        help="launcher 'ray' only: how the cluster's members are placed on the Ray nodes.",
        choices={name: f"{name}: {text}" for name, text in PLACEMENTS.items()},
    )
    max_restarts: int = _setting(
        2,
        title="Restarts inside the task",
        help="How many times a cluster whose member died is restarted from the last checkpoint "
        "before the task fails (a parameter-server worker is restarted in place).",
        minimum=0,
        maximum=10,
    )
    warm_spares: bool = _setting(
        False,
        title="Warm spares",
        help="Once training runs, keep spare processes that have imported TensorFlow and "
        "replace a lost member at once (launcher 'local': one for parameter_server, else one "
        "per member; launcher 'ray': one beside every member; each costs a TensorFlow import "
        "and about 600 MB of memory).",
    )
    loop: str = _setting(
        "custom",
        title="Training loop",
        help="Which training loop runs the epochs.",
        choices={name: f"{name}: {text}" for name, text in LOOPS.items()},
    )
    # Generous upper bounds: they catch typos (epochs=10000), not legitimate experiments.
    epochs: int = _setting(
        5, title="Epochs", help="Passes over the training split.", minimum=1, maximum=1000
    )
    batch_size: int = _setting(
        64,
        title="Global batch size",
        help="The global batch, split evenly across replicas.",
        minimum=1,
        maximum=65536,
    )
    learning_rate: float = _setting(
        1e-3,
        title="Learning rate",
        help="Adam's learning rate, within (0, 1].",
        above=0,
        maximum=1,
    )
    seed: int = _setting(
        42,
        title="Seed",
        help="Seeds weights, shuffling and dropout: same seed, same result.",
        minimum=0,
        maximum=2**31 - 1,
    )
    # A run setting, not a dataset one: how much memory a split may take is a property of the
    # host the training process runs on (raise it per run on a bigger worker), not of the data.
    cache_budget_mb: int = _setting(
        DEFAULT_CACHE_BUDGET_MB,
        title="In-memory cache budget (MiB)",
        help="The training process keeps a split's decoded examples in memory when they fit in "
        "this many MiB (the training split first, then validation with what is left); a larger "
        "split is streamed from the prepared files with a bounded shuffle buffer. 0: always "
        "stream.",
        minimum=0,
        maximum=1_048_576,
    )
    promote: bool = _setting(
        True,
        title="Promote",
        help="Move the `champion` alias when the evaluation gate passes.",
    )
    accept_drift: bool = _setting(
        False,
        title="Accept data drift",
        help="Train this run although the data gate found anomalies (drift, schema changes, "
        "missing values, values out of range) against the champion's data: for a known change. "
        "The MLflow run records it.",
    )
    # Read by the first task of a scheduled or asset-triggered run only: a manual run always
    # trains (`stratoflow.tracking.fingerprints`).
    force: bool = _setting(
        False,
        title="Train even if nothing changed",
        help="A scheduled or asset-triggered run skips training when its dataset, pipeline code "
        "and training configuration equal the champion's; true makes it train anyway. Manual "
        "runs always train.",
    )


def settings_of(config: type = TrainingConfig) -> dict[str, tuple[type, Setting]]:
    """Each training setting's name → its Python type and `Setting`, in declaration order."""
    hints = {"str": str, "int": int, "float": float, "bool": bool}
    return {f.name: (hints[str(f.type)], f.metadata["setting"]) for f in dataclasses.fields(config)}


def param_schema(kind: type, setting: Setting, default: Any) -> dict[str, Any]:
    """The keyword arguments of `airflow.sdk.Param` for one setting with default `default`."""
    json_type = _JSON_TYPES[kind]
    schema: dict[str, Any] = {
        "default": (default or None) if setting.optional else default,
        "type": ["null", json_type] if setting.optional else json_type,
        "title": setting.title,
        "description": setting.help,
    }
    choices = setting.allowed()
    if choices is not None:
        # An optional choice may be left empty: null (the form's default) and "" say "not set".
        schema["enum"] = [None, "", *choices] if setting.optional else list(choices)
        schema["values_display"] = {str(value): text for value, text in choices.items()}
    for key, bound in (
        ("minimum", setting.minimum),
        ("maximum", setting.maximum),
        ("exclusiveMinimum", setting.above),
    ):
        if bound is not None:
            schema[key] = bound
    if kind is float:
        schema["not"] = NOT_FINITE
    return schema


def param_schemas(defaults: TrainingConfig) -> dict[str, dict[str, Any]]:
    """The Param keyword arguments of every training setting, defaulting to `defaults`.

    Returns:
        A mapping from the `TrainingConfig` field name to the keyword arguments of
        `airflow.sdk.Param` (`default`, `title`, `description`, and JSON-schema keys such as
        `type`, `enum`, `minimum`), in the order the trigger form shows them.
    """
    return {
        name: param_schema(kind, setting, getattr(defaults, name))
        for name, (kind, setting) in settings_of().items()
    }


def validate_params(schemas: Mapping[str, Mapping[str, Any]], conf: Mapping[str, Any]) -> None:
    """Check a run conf against DAG Params schemas the way Airflow does when it creates a run.

    Raises:
        SpecError: an unknown key (with the allowed ones), or Airflow's own message for an
            invalid value: "Invalid input for param <name>: ...".
    """
    # Airflow's own dependency, called as `Param.resolve` calls it.
    from jsonschema import ValidationError, validate

    unknown = sorted(set(conf) - set(schemas))
    if unknown:
        renamed = RENAMED.get(unknown[0])
        hint = f" (renamed: {renamed})" if renamed else ""
        raise SpecError(
            f"run conf: unknown key {unknown[0]!r:.80}{hint}; allowed: {', '.join(schemas)}"
        )
    for key, value in conf.items():
        schema = {k: v for k, v in schemas[key].items() if k not in ("default", "description")}
        try:
            validate(value, schema)
        except ValidationError as error:
            raise SpecError(f"Invalid input for param {key}: {error.message}") from None


def resolve_training(
    defaults: TrainingConfig, conf: Mapping[str, Any], defaults_source: str = "training"
) -> TrainingConfig:
    """`defaults` with a run's overrides (DAG Params, CLI flags) applied, after checking them.

    The one validation of a run's training settings: the CLI before Airflow starts, and the
    first task of every DAG run, call this (through `stratoflow.config.run_plan.resolve_plan`).
    The settings are checked once, together; only when they fail are the defaults checked
    alone, so that a default at fault is named as the spec's (`defaults_source`), not the conf's.

    Raises:
        SpecError: an unknown key, an invalid value or an invalid combination (named).
    """
    validate_params(param_schemas(defaults), conf)
    merged = {**dataclasses.asdict(defaults), **conf}
    for optional in ("cluster", "ray_cluster"):
        if merged[optional] is None:
            merged[optional] = ""  # the Param's default and a cleared form field: not set
    result = build(TrainingConfig, merged, "run conf")
    try:
        check_training(result, "run conf")
    except SpecError:
        check_training(defaults, defaults_source)
        raise
    return result


def _check_setting(name: str, value: Any, setting: Setting, where: str) -> None:
    if setting.optional and not value:
        return
    # The deployment's cluster names are checked where a run is resolved (the Params, and
    # `run_plan.resolve_plan` in the first task), not wherever a resolved plan is rebuilt: a
    # training member, on a Ray host or in the pipeline environment, holds no cluster list.
    choices = setting.choices
    if choices is not None and value not in choices:
        raise SpecError(
            f"{where}.{name} {value!r:.80} is not allowed; "
            f"allowed: {', '.join(map(str, choices)) or 'none configured'}"
        )
    if setting.above is not None and not setting.above < value <= (setting.maximum or value):
        raise SpecError(
            f"{where}.{name} must be within ({setting.above}, {setting.maximum}], got {value}"
        )
    if setting.minimum is not None and value < setting.minimum:
        raise SpecError(f"{where}.{name} must be >= {setting.minimum}, got {value}")
    if setting.maximum is not None and value > setting.maximum:
        raise SpecError(f"{where}.{name} must be <= {setting.maximum}, got {value}")


def check_training(training: TrainingConfig, where: str = "training") -> None:
    """Check each setting against its `Setting`, then the combinations no schema expresses.

    Raises:
        SpecError: the first invalid value or combination, naming the field.
    """
    for name, (_, setting) in settings_of().items():
        _check_setting(name, getattr(training, name), setting, where)
    strategy = STRATEGIES[training.strategy]
    if training.cluster and not strategy.standing_cluster:
        raise SpecError(
            f"{where}.cluster (standing servers) applies to strategy "
            f"{' or '.join(map(repr, strategies_with('standing_cluster')))} only; "
            "multi_worker_mirrored across hosts runs on a Ray cluster (launcher 'ray', docs: "
            "how-to/several-machines.md)"
        )
    if training.launcher == "ray" and training.cluster:
        raise SpecError(
            f"{where}.cluster (standing servers) cannot be combined with launcher 'ray': the "
            "Ray launcher starts the whole cluster itself; clear one of them"
        )
    if training.launcher == "ray":
        try:
            extras.require("ray", f"{where}.launcher 'ray'")
        except extras.MissingExtra as error:
            raise SpecError(str(error)) from None
    if training.launcher != "ray" and training.ray_cluster:
        raise SpecError(
            f"{where}.ray_cluster applies to launcher 'ray' only; set launcher 'ray' or clear it"
        )
    if training.loop not in strategy.loops:
        loop_ok = [name for name, other in STRATEGIES.items() if training.loop in other.loops]
        raise SpecError(
            f"{where}.loop {training.loop!r} does not work with strategy {training.strategy!r} "
            f"in Keras 3; use loop 'custom', or one of the strategies {training.loop} supports: "
            f"{', '.join(loop_ok)}"
        )
    divisor = strategy.batch_divides_by
    if divisor and training.batch_size % getattr(training, divisor):
        raise SpecError(
            f"{where}.batch_size {training.batch_size} must be divisible by {divisor} "
            f"{getattr(training, divisor)}: the global batch is split evenly across {divisor}"
        )
