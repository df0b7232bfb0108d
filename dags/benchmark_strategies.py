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

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, TriggerRule, task

from dags.refusals import no_retry_on_refusal
from stratoflow.config import names
from stratoflow.config.params import benchmark_params
from stratoflow.config.spec import PipelineSpec, list_pipelines, load_spec

START_DATE = datetime(2025, 1, 1, tzinfo=UTC)


def _airflow_run(context: Any) -> Any:
    from tasks.steps import AirflowRun

    return AirflowRun.from_context(context)


def _mark_parent_failed(pipeline: str) -> Callable[[Any], None]:
    def mark_parent_failed(context: Any) -> None:
        from tasks import strategy_benchmark

        strategy_benchmark.mark_parent_failed(pipeline, _airflow_run(context))

    return mark_parent_failed


def build_dag(spec: PipelineSpec) -> DAG:
    """The strategy-benchmark DAG of one pipeline spec.

    Args:
        spec: the validated pipeline spec (model, batch size, gate, owner, retries).

    Returns:
        The DAG `benchmark_strategies_<name>`: plan_strategies → train_strategy (mapped, one
        instance per strategy) → compare_strategies. Manual trigger only.
    """
    pipeline = spec.name
    with DAG(
        dag_id=names.benchmark_dag_id(pipeline),
        description=f"Benchmark the tf.distribute strategies on pipeline {pipeline}",
        doc_md=(__doc__ or "").strip(),
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,  # two benchmarks at once would measure each other
        tags=sorted({*spec.tags, "stratoflow", "benchmark"}),
        params={name: Param(**kwargs) for name, kwargs in benchmark_params(spec).items()},
        default_args={
            "owner": spec.owner,
            "retries": spec.retries,
            "retry_delay": timedelta(seconds=spec.retry_delay_seconds),
        },
    ) as dag:

        @task(on_failure_callback=_mark_parent_failed(pipeline))
        @no_retry_on_refusal
        def plan_strategies(**context: Any) -> list[dict[str, Any]]:
            from tasks import strategy_benchmark

            return strategy_benchmark.plan(pipeline, context["params"], _airflow_run(context))

        # retries=0: a failed strategy is a result to report, and a retry would resume from
        # checkpoints and time a different run. One at a time: parallel trainings share cores.
        @task(
            retries=0,
            max_active_tis_per_dag=1,
            map_index_template="{{ task.op_kwargs['entry']['strategy'] }}",
        )
        def train_strategy(entry: dict[str, Any], **context: Any) -> dict[str, Any]:
            from tasks import strategy_benchmark

            return strategy_benchmark.train_strategy(
                pipeline, context["params"], _airflow_run(context), entry
            )

        @task(
            trigger_rule=TriggerRule.ALL_DONE,  # compare whatever finished, failures included
            on_failure_callback=_mark_parent_failed(pipeline),
        )
        @no_retry_on_refusal
        def compare_strategies(
            planned: list[dict[str, Any]] | None, **context: Any
        ) -> dict[str, Any]:
            from tasks import strategy_benchmark

            return strategy_benchmark.compare(
                pipeline, context["params"], _airflow_run(context), planned
            )

        planned: Any = plan_strategies()
        trained = train_strategy.expand(entry=planned)
        trained >> compare_strategies(planned)
    return dag


for _pipeline in list_pipelines():
    _dag = build_dag(load_spec(_pipeline))
    globals()[_dag.dag_id] = _dag
