"""Retrain a TensorFlow model and track it in MLflow: one DAG per pipeline spec.

`prepare_dataset` builds or loads the versioned TFDS dataset, `train_model` trains under the
`tf.distribute` strategy the run chose, `evaluate_model` scores the test split and decides the
gate against the current champion, and `log_and_register` registers a model version in MLflow
(promoting it to `champion` only when the gate passed).

It runs on the pipeline's cron, and whenever its dataset's asset gets an event (the DAG
`refresh_<dataset>` succeeded, or someone posted one through the REST API), whichever comes first.

Every training setting is a Param: trigger with a config such as
`{"strategy": "mirrored", "replicas": 2, "epochs": 3}`; Airflow refuses invalid values before a
run exists. A task that fails for good (retries exhausted) cleans up the run's MLflow run,
checkpoints and registered version; if its process was killed outright, the DAG run's failure
marks the MLflow run KILLED instead. A conf the spec refuses (e.g. a batch size the replicas
cannot split) fails `prepare_dataset` at once, without a retry and before any MLflow run opens.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable, Param, task
from airflow.sdk.exceptions import AirflowFailException

from dags.refusals import no_retry_on_refusal
from stratoflow.config import names
from stratoflow.config.assets import dataset_asset
from stratoflow.config.params import dag_params
from stratoflow.config.spec import PipelineSpec, list_pipelines, load_spec

# Fixed and in the past: with catchup off, only the next scheduled slot (or a trigger) runs.
START_DATE = datetime(2025, 1, 1, tzinfo=UTC)


def _airflow_run(context: Any) -> Any:
    from tasks.steps import AirflowRun

    return AirflowRun.from_context(context)


def _clean_up_on_failure(pipeline: str) -> Callable[[Any], None]:
    # Airflow 3 calls on_failure_callback only when a task has failed for good; a failure that
    # will be retried calls on_retry_callback instead, so a retry keeps its checkpoints.
    def clean_up_failed_run(context: Any) -> None:
        from tasks import steps

        run = _airflow_run(context)
        # A refusal in the first try of the first task came before any MLflow call
        # (`tasks.steps.prepare` resolves the config first): nothing to undo there.
        refused_at_once = (
            context["ti"].task_id == "prepare_dataset"
            and run.try_number == 1
            and isinstance(context.get("exception"), AirflowFailException)
        )
        steps.clean_up_failed_run(pipeline, run, tracked=not refused_at_once)

    return clean_up_failed_run


def _end_runs_left_running(pipeline: str) -> Callable[[Any], None]:
    # A task process killed outright (SIGKILL, OOM) runs no failure callback: its supervisor
    # just reports the task failed. The DAG run's failure callback (run by the DAG processor)
    # then finds its MLflow run still RUNNING and ends it KILLED.
    def end_runs_left_running(context: Any) -> None:
        from tasks import steps

        run = steps.AirflowRun(context["dag"].dag_id, context["run_id"])
        steps.clean_up_stopped_run(pipeline, run)

    return end_runs_left_running


def schedule_for(spec: PipelineSpec) -> Any:
    """The spec's cron or an event of its dataset's asset; the asset alone without a cron."""
    asset = dataset_asset(spec.dataset.name)
    if spec.schedule is None:
        return [asset]
    cron = CronTriggerTimetable(spec.schedule, timezone="UTC")
    return AssetOrTimeSchedule(timetable=cron, assets=[asset])


def _doc_md(spec: PipelineSpec) -> str:
    return "\n\n".join(
        [
            (__doc__ or "").strip(),
            f"## Pipeline `{spec.name}`",
            spec.description,
            f"- dataset: `{spec.dataset.name}` {spec.dataset.version}\n"
            f"- model builder: `{spec.model.builder}`\n"
            f"- schedule: `{spec.schedule or 'none'}` (cron, UTC) or an event of the asset "
            f"`{spec.dataset.name}`\n"
            f"- registered model: `{spec.registered_model}`\n"
            f"- evaluation gate: test accuracy >= {spec.evaluation.min_accuracy}, at most "
            f"{spec.evaluation.max_regression} below the champion",
        ]
    )


def build_dag(spec: PipelineSpec) -> DAG:
    """The retraining DAG of one pipeline spec.

    Args:
        spec: the validated pipeline spec (schedule, owner, retries, tags, training defaults).

    Returns:
        The DAG `retrain_<name>` with tasks prepare_dataset → train_model → evaluate_model →
        log_and_register.
    """
    pipeline = spec.name
    with DAG(
        dag_id=names.retrain_dag_id(pipeline),
        description=spec.description,
        doc_md=_doc_md(spec),
        schedule=schedule_for(spec),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=sorted({*spec.tags, "stratoflow"}),
        params={name: Param(**kwargs) for name, kwargs in dag_params(spec).items()},
        on_failure_callback=_end_runs_left_running(pipeline),
        default_args={
            "owner": spec.owner,
            "retries": spec.retries,
            "retry_delay": timedelta(seconds=spec.retry_delay_seconds),
            "on_failure_callback": _clean_up_on_failure(pipeline),
        },
    ) as dag:
        # multiple_outputs=False: each result travels as one small dict, not one XCom per key.

        @task(multiple_outputs=False)
        @no_retry_on_refusal
        def prepare_dataset(**context: Any) -> dict[str, Any]:
            from tasks import steps

            return steps.prepare(pipeline, context["params"], _airflow_run(context))

        @task(multiple_outputs=False)
        @no_retry_on_refusal
        def train_model(dataset: dict[str, Any], **context: Any) -> dict[str, Any]:
            from tasks import steps

            return steps.train(pipeline, context["params"], _airflow_run(context), dataset)

        @task(multiple_outputs=False)
        @no_retry_on_refusal
        def evaluate_model(
            dataset: dict[str, Any], training: dict[str, Any], **context: Any
        ) -> dict[str, Any]:
            from tasks import steps

            return steps.evaluate(
                pipeline, context["params"], _airflow_run(context), dataset, training
            )

        @task(task_id="log_and_register", multiple_outputs=False)
        @no_retry_on_refusal
        def log_and_register_model(
            dataset: dict[str, Any],
            training: dict[str, Any],
            evaluation: dict[str, Any],
            **context: Any,
        ) -> dict[str, Any]:
            from tasks import steps

            return steps.log_and_register(
                pipeline, context["params"], _airflow_run(context), dataset, training, evaluation
            )

        # At parse time these are XComArgs standing in for the dicts the tasks will receive.
        dataset: Any = prepare_dataset()
        training: Any = train_model(dataset)
        evaluation: Any = evaluate_model(dataset, training)
        log_and_register_model(dataset, training, evaluation)
    return dag


for _pipeline in list_pipelines():
    _dag = build_dag(load_spec(_pipeline))
    globals()[_dag.dag_id] = _dag
