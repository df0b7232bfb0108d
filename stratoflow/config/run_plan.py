"""A run's plan: a pipeline and a run's conf resolved once into one typed, frozen `RunPlan`.

The plan holds everything a run decides before any work starts: the pipeline spec with the run's
training settings applied (`TrainingConfig`), the members of the cluster with their roles
(`stratoflow.config.strategies.planned_members`), the launcher and the cluster it runs on. It is
resolved and validated here, once per run: by `stratoflow run` before Airflow starts, and by the
retrain DAG's first task. It then travels as itself: through XCom to the later tasks, inside the
`TrainingPayload` to every training process. `RunPlan.from_json` checks that what arrives is a
plan (keys, types, members that fit its settings) and never validates the settings again.

The DAG files call `load_pipeline` at parse time, so this module stays light: no TensorFlow,
Keras, MLflow or Airflow (the bundled model builders import Keras only when called). The check of
a pipeline's own code against its data needs TensorFlow and stays in
`stratoflow.training.validation.check_pipeline_code`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from stratoflow.config import clusters
from stratoflow.config.model_builders import (
    MODEL_BUILDERS,
    check_hyperparameters,
    has_random_layers,
)
from stratoflow.config.parsing import SpecError, build, require_mapping
from stratoflow.config.spec import PipelineSpec, load_spec
from stratoflow.config.strategies import STRATEGIES, ClusterPlan, PlannedMember, planned_members
from stratoflow.config.training import TrainingConfig, resolve_training

# The key of the plan's members in its serialised form, beside the spec's own keys.
CLUSTER_KEY = "cluster"


class PlanError(SpecError):
    """A serialised run plan is not one (a hand-edited XCom or payload); the message names the
    field. A `SpecError`: the same input fails the same way on every try, so a task refuses it
    without a retry."""


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved and validated once: what it trains, how, with which members, where.

    Attributes:
        spec: the pipeline spec with the run's training settings applied.
        cluster: the processes the run starts and the member whose result is the run's.
    """

    spec: PipelineSpec
    cluster: ClusterPlan

    @classmethod
    def of(cls, spec: PipelineSpec) -> RunPlan:
        """The plan of `spec`, whose training settings are already resolved and validated."""
        return cls(spec=spec, cluster=planned_members(spec.training))

    @property
    def pipeline(self) -> str:
        """The pipeline's name."""
        return self.spec.name

    @property
    def training(self) -> TrainingConfig:
        """The run's training settings (the spec's defaults with the run's conf applied)."""
        return self.spec.training

    @property
    def launcher(self) -> str:
        """Who starts the members: `local` (this task's host) or `ray`."""
        return self.spec.training.launcher

    @property
    def runs_on(self) -> str:
        """The deployment's cluster the run uses by name: its Ray cluster for launcher `ray`, its
        standing cluster for a `parameter_server` run on one; "" for this task's host alone."""
        return self.training.ray_cluster or self.cluster.standing_cluster

    def conf(self) -> dict[str, Any]:
        """The run's training settings as a DAG run conf (every Param, resolved)."""
        return asdict(self.training)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON types: the spec's keys (the pipeline name included) and `cluster`."""
        cluster = asdict(self.cluster)
        cluster["members"] = list(cluster["members"])
        return {**asdict(self.spec), CLUSTER_KEY: cluster}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, what: str = "run plan") -> RunPlan:
        """Rebuild a plan from `to_dict()` output, checking that it is one.

        Keys and types are checked, the strategy must be a known one, and the members must be
        the ones its settings plan; the settings are not validated again (that was done once,
        when the plan was resolved).

        Args:
            data: the dict.
            what: where it came from, for the error message (e.g. "the result of
                prepare_dataset: run_config").

        Raises:
            PlanError: a key missing or unknown, a value of the wrong type, an unknown strategy,
                or members that do not fit the settings; the message names the field.
        """
        try:
            data = dict(require_mapping(data, what))
            if not isinstance(data.get("name"), str):
                raise SpecError(f"{what}: expected a run plan with its pipeline's 'name'")
            if CLUSTER_KEY not in data:
                raise SpecError(f"{what}: missing required key {CLUSTER_KEY!r}")
            cluster = _cluster_from_dict(data.pop(CLUSTER_KEY), f"{what}: {CLUSTER_KEY}")
            spec = build(PipelineSpec, data, what)
        except PlanError:
            raise
        except SpecError as error:
            raise PlanError(str(error)) from None
        strategy = spec.training.strategy
        if strategy not in STRATEGIES:
            raise PlanError(
                f"{what}: training.strategy {strategy!r} is not allowed; allowed: "
                f"{', '.join(STRATEGIES)}"
            )
        if cluster != planned_members(spec.training):
            raise PlanError(
                f"{what}: {CLUSTER_KEY} is not the members its training settings plan "
                f"(strategy {strategy!r}, workers {spec.training.workers}, ps "
                f"{spec.training.ps}, cluster {spec.training.cluster!r})"
            )
        return cls(spec=spec, cluster=cluster)

    @classmethod
    def from_json(cls, text: str, what: str = "run plan") -> RunPlan:
        """Rebuild a plan from `to_json()` output (see `from_dict`).

        Raises:
            PlanError: not JSON, or not a plan (the field named).
        """
        try:
            data = json.loads(text)
        except ValueError as error:
            raise PlanError(f"{what}: not JSON: {error}") from None
        return cls.from_dict(data, what)


def _cluster_from_dict(data: Any, what: str) -> ClusterPlan:
    data = require_mapping(data, what)
    known = {f.name for f in dataclasses.fields(ClusterPlan)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"{what}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(known))}")
    members = data.get("members")
    if not isinstance(members, list):
        raise SpecError(f"{what}.members: expected a list, got {type(members).__name__}")
    result_from, standing = data.get("result_from"), data.get("standing_cluster", "")
    for key, value in (("result_from", result_from), ("standing_cluster", standing)):
        if not isinstance(value, str):
            raise SpecError(f"{what}.{key}: expected str, got {type(value).__name__} {value!r:.80}")
    return ClusterPlan(
        members=tuple(
            build(PlannedMember, member, f"{what}.members[{index}]")
            for index, member in enumerate(members)
        ),
        result_from=result_from,
        standing_cluster=standing,
    )


def load_pipeline(name: str) -> PipelineSpec:
    """The validated spec of pipeline `name`, its model checked too (what a DAG file needs).

    Raises:
        SpecError: no such pipeline, or an invalid key, value or model (named in the message).
    """
    spec = load_spec(name)
    check_model(spec, f"{spec.source}: training")
    return spec


def resolve_plan(pipeline: str, conf: Mapping[str, Any]) -> RunPlan:
    """The plan of one run of `pipeline` with the run's Params `conf`, validated once.

    A run that names no cluster gets the deployment's cluster `default` where it needs one
    (`stratoflow.config.clusters`): a Ray cluster for launcher `ray`, and a standing cluster,
    if the deployment has one, for a local `parameter_server` run.

    Args:
        pipeline: a pipeline name.
        conf: the run's Params (a DAG run's `conf`, or `stratoflow run`'s flags).

    Raises:
        SpecError: an unknown pipeline or Param, or an invalid value or combination (named in
            the message).
    """
    # The spec's training defaults are checked with the run's conf, once (`resolve_training`).
    spec = load_spec(pipeline, check_settings=False)
    training = resolve_training(spec.training, conf, f"{spec.source}: training")
    check_model(spec, f"{spec.source}: training")
    if (
        STRATEGIES[training.strategy].standing_cluster
        and training.launcher == "local"
        and not training.cluster
        and clusters.DEFAULT in clusters.standing_clusters()
    ):
        training = dataclasses.replace(training, cluster=clusters.DEFAULT)
    if training.launcher == "ray" and not training.ray_cluster:
        configured = clusters.ray_clusters()
        if clusters.DEFAULT not in configured:
            raise SpecError(
                "run conf.ray_cluster: launcher 'ray' needs a Ray cluster of this deployment and "
                "it has no cluster 'default'; name one of: "
                f"{', '.join(sorted(configured)) or f'none (set ${clusters.RAY_CLUSTERS_ENV})'}"
            )
        training = dataclasses.replace(training, ray_cluster=clusters.DEFAULT)
    # A spec's own default names a cluster too: it must be one of this deployment's.
    if training.cluster:
        clusters.standing_cluster(training.cluster)
    if training.ray_cluster:
        clusters.ray_address(training.ray_cluster)
    spec = dataclasses.replace(spec, training=training)
    check_model(spec, "run conf")
    return RunPlan.of(spec)


def resolve_variant(
    spec: PipelineSpec, overrides: Mapping[str, Any], defaults_source: str = "training"
) -> RunPlan:
    """The plan of a run of `spec` with `overrides` on its training settings, validated once.

    For runs derived from one spec, such as the strategy benchmark's: its own settings (epochs,
    seed), then one plan per strategy. No deployment cluster is chosen and the model is not
    checked here (the benchmark marks what the model refuses as unavailable).

    Args:
        spec: a loaded spec, or a plan's spec.
        overrides: the run's training settings (Param names).
        defaults_source: how an error names `spec`'s settings when one of them is at fault.

    Raises:
        SpecError: an unknown setting, or an invalid value or combination (named).
    """
    training = resolve_training(spec.training, overrides, defaults_source)
    return RunPlan.of(dataclasses.replace(spec, training=training))


def check_model(spec: PipelineSpec, where: str = "training") -> None:
    """Refuse an unknown model builder, and a strategy that cannot train the model (no Keras).

    `central_storage` fails on layers that draw random numbers; a bundled builder has Dropout
    exactly when its `dropout` hyperparameter is non-zero (`model_builders.has_random_layers`).

    Raises:
        SpecError: naming `where` and the field.
    """
    builder = spec.model.builder
    if ":" not in builder and builder not in MODEL_BUILDERS:
        raise SpecError(
            f"{where.rsplit(':', 1)[0]}: model.builder {builder!r} is not a known model builder; "
            f"allowed: {', '.join(sorted(MODEL_BUILDERS))}, or an import path 'module:function'"
        )
    if ":" not in builder:  # a bundled builder's signature needs no import of the pipeline's code
        check_hyperparameters(
            MODEL_BUILDERS[builder],
            spec.model.hyperparameters,
            builder,
            where.rsplit(":", 1)[0] + ": model",
        )
    strategy = STRATEGIES.get(spec.training.strategy)  # unknown: `check_training` says so
    if (
        strategy is not None
        and strategy.refuses_random_layers
        and has_random_layers(builder, spec.model.hyperparameters)
    ):
        raise SpecError(
            f"{where}.strategy {spec.training.strategy!r} cannot train model {builder!r}: it "
            f"has Dropout (model.hyperparameters.dropout "
            f"{spec.model.hyperparameters.get('dropout')}), and TensorFlow's CentralStorage fails "
            "on layers that draw random numbers; choose another strategy, e.g. 'mirrored'"
        )
