"""Benchmark the `tf.distribute` strategies on this host and recommend one: a DAG per pipeline.

`plan_strategies` lists the strategies this host can run (each as training overrides), prepares
the dataset once and opens a parent MLflow run. `train_strategy` is mapped over that list: one
task instance per strategy, one at a time so that they do not compete for the CPU, each training
the pipeline's model briefly with the same seed in its own training processes and its own child
MLflow run. `compare_strategies` runs even when some trainings failed: it writes the comparison
(throughput, time to first step, time to the gate's accuracy, final accuracies) on the parent run
and tags the recommended strategy. No model version is registered and no alias moves.

Trigger it by hand, e.g. with `{"epochs": 3, "strategies": ["one_device", "mirrored"]}`, or run
it locally with `stratoflow benchmark <pipeline>`.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, TriggerRule, task

from stratoflow.config import names
from stratoflow.config.params import benchmark_params
from stratoflow.config.spec import PipelineSpec
from stratoflow.dags import factory


def build_dag(spec: PipelineSpec) -> DAG:
    """The strategy-benchmark DAG of one pipeline spec.

    Args:
        spec: the validated pipeline spec (model, batch size, gate, owner, retries).

    Returns:
        The DAG `benchmark_strategies_<name>`: plan_strategies → train_strategy (mapped, one
        instance per strategy) → compare_strategies. Manual trigger only.
    """
    pipeline = spec.name
    with factory.new_dag(
        names.benchmark_dag_id(pipeline),
        defaults=factory.spec_defaults(spec),
        params=benchmark_params(spec),
        description=f"Benchmark the tf.distribute strategies on pipeline {pipeline}",
        doc_md=(__doc__ or "").strip(),
        schedule=None,
        tags=factory.spec_tags(spec, "benchmark"),
    ) as dag:
        # max_active_runs=1 (the factory's): two benchmarks at once would measure each other.

        @factory.refusing_task(
            task_id=names.PLAN_STRATEGIES_TASK,
            on_failure_callback=factory.mark_benchmark_failed(pipeline),
        )
        def plan_strategies(**context: Any) -> list[dict[str, Any]]:
            from stratoflow.tasks import strategy_benchmark

            run = factory.airflow_run(context)
            planned = strategy_benchmark.plan(pipeline, context["params"], run)
            return [entry.to_dict() for entry in planned]

        # retries=0: a failed strategy is a result to report, and a retry would resume from
        # checkpoints and time a different run. One at a time: parallel trainings share cores.
        @task(
            task_id=names.TRAIN_STRATEGY_TASK,
            retries=0,
            max_active_tis_per_dag=1,
            map_index_template="{{ task.op_kwargs['entry']['strategy'] }}",
        )
        def train_strategy(entry: dict[str, Any], **context: Any) -> dict[str, Any]:
            from stratoflow.tasks import strategy_benchmark

            run = factory.airflow_run(context)
            planned = strategy_benchmark.PlannedStrategy.from_dict(entry)
            return strategy_benchmark.train_strategy(run, planned).to_dict()

        @factory.refusing_task(
            task_id=names.COMPARE_STRATEGIES_TASK,
            trigger_rule=TriggerRule.ALL_DONE,  # compare whatever finished, failures included
            on_failure_callback=factory.mark_benchmark_failed(pipeline),
        )
        def compare_strategies(
            planned: list[dict[str, Any]] | None, **context: Any
        ) -> dict[str, Any]:
            from stratoflow.tasks import strategy_benchmark

            run = factory.airflow_run(context)
            entries = (
                None
                if planned is None
                else [strategy_benchmark.PlannedStrategy.from_dict(entry) for entry in planned]
            )
            return strategy_benchmark.compare(pipeline, run, entries).to_dict()

        planned: Any = plan_strategies()
        trained = train_strategy.expand(entry=planned)
        trained >> compare_strategies(planned)
    return dag


def benchmark_dag(spec: PipelineSpec) -> DAG | None:
    """The strategy benchmark DAG of a pipeline, or None: the recommendation compares test
    accuracies, so classification pipelines only."""
    return build_dag(spec) if spec.task == "classification" else None
