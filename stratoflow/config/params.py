"""The DAG Params of a pipeline: one per `TrainingConfig` field, as JSON-schema keyword arguments.

The schemas make Airflow itself refuse a bad trigger (UI form, REST API, `airflow dags trigger`,
`airflow dags test`) before a DAG run exists: Airflow validates `conf` against them when it creates
the run, and the error names the field and, for a choice, the allowed values. Combinations
(e.g. a batch size that replicas cannot split) are checked by
`stratoflow.config.spec.check_training`
when the run's first task starts.

This module imports no Airflow: `dags/retrain.py` wraps each entry in `airflow.sdk.Param`.
"""

from __future__ import annotations

import sys
from typing import Any

from stratoflow.config.options import LOOPS, PS_CHOICES, REPLICA_CHOICES, STRATEGIES, WORKER_CHOICES
from stratoflow.config.spec import PipelineSpec

# Generous upper bounds: they catch typos (epochs=10000), not legitimate experiments.
MAX_EPOCHS = 1000
MAX_BATCH_SIZE = 65536
MAX_SEED = 2**31 - 1

# Matches NaN, Infinity and -Infinity, and no finite number: a `not` of it refuses them. Bounds
# alone cannot (every comparison with NaN is false, so NaN passes `minimum` and `maximum`), and
# JSON schema cannot write infinity as a bound. Its title shows in the error message.
NOT_FINITE: dict[str, Any] = {
    "title": "NaN, Infinity or -Infinity",
    "anyOf": [{"exclusiveMinimum": sys.float_info.max}, {"exclusiveMaximum": -sys.float_info.max}],
}


def dag_params(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """The Param keyword arguments for every training setting a trigger may override.

    Args:
        spec: the pipeline whose training defaults become the Params' defaults.

    Returns:
        A mapping from the `TrainingConfig` field name to the keyword arguments of
        `airflow.sdk.Param` (`default`, `description`, and JSON-schema keys such as `type`,
        `enum`, `minimum`), in the order the trigger form shows them.
    """
    training = spec.training
    return {
        "strategy": {
            "default": training.strategy,
            "type": "string",
            "enum": list(STRATEGIES),
            "title": "Distribution strategy",
            "description": "The tf.distribute strategy of this run.",
            "values_display": {
                name: f"{name}: {traits.description}" for name, traits in STRATEGIES.items()
            },
        },
        "replicas": {
            "default": training.replicas,
            "type": "integer",
            "enum": list(REPLICA_CHOICES),
            "title": "Replicas",
            "description": (
                "Replicas for `mirrored` and `central_storage` on a CPU-only host (logical CPU "
                "devices); "
                "the batch size must be divisible by it."
            ),
            "values_display": {
                str(n): f"{n} replica{'s' if n > 1 else ''}" for n in REPLICA_CHOICES
            },
        },
        "workers": {
            "default": training.workers,
            "type": "integer",
            "enum": list(WORKER_CHOICES),
            "title": "Workers",
            "description": "Worker processes for `multi_worker_mirrored` and `parameter_server`.",
        },
        "ps": {
            "default": training.ps,
            "type": "integer",
            "enum": list(PS_CHOICES),
            "title": "Parameter servers",
            "description": "Parameter-server processes for `parameter_server`.",
        },
        "cluster": {
            # "null" in the type makes the Param optional in the UI's trigger form: a required
            # string whose default is empty marks the form invalid and disables Trigger.
            "default": training.cluster or None,
            "type": ["null", "string"],
            "title": "Standing cluster",
            "description": (
                'parameter_server only: standing servers as JSON {"worker": ["host:port"], '
                '"ps": ["host:port"]} (started with `stratoflow serve`); empty or null: launch '
                "local processes, or use $STRATOFLOW_CLUSTER."
            ),
        },
        "loop": {
            "default": training.loop,
            "type": "string",
            "enum": list(LOOPS),
            "title": "Training loop",
            "description": "Which training loop runs the epochs.",
            "values_display": {name: f"{name}: {text}" for name, text in LOOPS.items()},
        },
        "epochs": {
            "default": training.epochs,
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_EPOCHS,
            "title": "Epochs",
            "description": "Passes over the training split.",
        },
        "batch_size": {
            "default": training.batch_size,
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_BATCH_SIZE,
            "title": "Global batch size",
            "description": "The global batch, split evenly across replicas.",
        },
        "learning_rate": {
            "default": training.learning_rate,
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "not": NOT_FINITE,
            "title": "Learning rate",
            "description": "Adam's learning rate, within (0, 1].",
        },
        "seed": {
            "default": training.seed,
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_SEED,
            "title": "Seed",
            "description": "Seeds weights, shuffling and dropout: same seed, same result.",
        },
        "promote": {
            "default": training.promote,
            "type": "boolean",
            "title": "Promote",
            "description": "Move the `champion` alias when the evaluation gate passes.",
        },
    }


BENCHMARK_DEFAULT_EPOCHS = 3
BENCHMARK_DEFAULT_TOLERANCE = 0.01


def benchmark_params(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """The Param keyword arguments of the strategy-benchmark DAG of `spec`.

    Every strategy trains the spec's model with the spec's batch size and learning rate; these
    Params choose how long (`epochs`), the `seed`, which `strategies` (empty: every one this host
    can run) and the accuracy `tolerance` of the recommendation rule.

    Returns:
        A mapping from Param name to the keyword arguments of `airflow.sdk.Param`.
    """
    training = dag_params(spec)
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
