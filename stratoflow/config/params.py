"""The DAG Params of a pipeline's DAGs, as JSON-schema keyword arguments of `airflow.sdk.Param`.

The schemas make Airflow itself refuse a bad trigger (UI form, REST API, `airflow dags trigger`,
`airflow dags test`) before a DAG run exists: Airflow validates `conf` against them when it creates
the run, and the error names the field and, for a choice, the allowed values. A retrain DAG's
Params come from the training settings' own metadata (`stratoflow.config.training`);
combinations (e.g. a batch size that replicas cannot split) are checked when the run's first
task starts (`stratoflow.config.run_plan.resolve_plan`).

This module imports no Airflow: the DAG files wrap each entry in `airflow.sdk.Param`.
"""

from __future__ import annotations

from typing import Any

from stratoflow.config.spec import PipelineSpec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import NOT_FINITE, TrainingConfig, param_schemas


def dag_params(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """The Param keyword arguments of a retrain DAG: one per training setting.

    Generated from the `TrainingConfig` fields' metadata (`stratoflow.config.training`), with
    the spec's training values as defaults.
    """
    return param_schemas(spec.training)


BENCHMARK_DEFAULT_EPOCHS = 3
BENCHMARK_DEFAULT_TOLERANCE = 0.01


def benchmark_params(spec: PipelineSpec | None = None) -> dict[str, dict[str, Any]]:
    """The Param keyword arguments of the strategy-benchmark DAG of `spec`.

    Every strategy trains the spec's model with the spec's batch size and learning rate; these
    Params choose how long (`epochs`), the `seed`, which `strategies` (empty: every one this host
    can run) and the accuracy `tolerance` of the recommendation rule. The one declaration of
    them: the DAG's Params, `stratoflow benchmark`'s flags and the benchmark's check of a conf's
    keys are made from it.

    Args:
        spec: the pipeline (its training values are the defaults); None: the settings' own
            defaults (for what does not depend on a pipeline: the names, types and texts).

    Returns:
        A mapping from Param name to the keyword arguments of `airflow.sdk.Param`.
    """
    training = param_schemas(spec.training if spec is not None else TrainingConfig())
    return {
        "epochs": {
            **training["epochs"],
            "default": BENCHMARK_DEFAULT_EPOCHS,
            "description": (
                "Passes over the training split per strategy; throughput is the median over "
                "the epochs after the first."
            ),
        },
        "seed": training["seed"],
        "strategies": {
            "default": [],
            "type": "array",
            "items": {"type": "string", "enum": list(STRATEGIES)},
            "uniqueItems": True,
            "title": "Strategies",
            "description": (
                "Strategies to benchmark; empty: every strategy this host can run. A named "
                "strategy this host cannot run is reported as failed, with the reason."
            ),
        },
        "tolerance": {
            "default": BENCHMARK_DEFAULT_TOLERANCE,
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "not": NOT_FINITE,
            "title": "Accuracy tolerance",
            "description": (
                "The recommendation is the fastest strategy whose final test accuracy is at "
                "most this far below the best one's."
            ),
        },
    }
