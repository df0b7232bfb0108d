"""The Airflow DAG factory: what every stratoflow DAG shares, written once. It defines no DAG.

The DAG builders (`retrain.py`, `benchmark_strategies.py`, `refresh_datasets.py`) only wire their
tasks: each task body imports its `tasks` module when it runs (parsing stays free of TensorFlow
and MLflow), turns its XCom inputs into the typed results they stand for, calls one plain
function and hands its result back as a small JSON dict. Everything else lives here: the start
date, the run settings every DAG has, the Params, the task defaults from the pipeline spec, the
refusal rule (`stratoflow/dags/refusals.py`) and the failure callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from stratoflow.config import names
from stratoflow.config.spec import PipelineSpec
from stratoflow.dags.refusals import no_retry_on_refusal

if TYPE_CHECKING:
    from stratoflow.tasks.run_context import AirflowRun

# Fixed and in the past: with catchup off, only the next scheduled slot (or a trigger) runs.
START_DATE = datetime(2025, 1, 1, tzinfo=UTC)


def new_dag(
    dag_id: str,
    *,
    defaults: Mapping[str, Any],
    params: Mapping[str, Mapping[str, Any]] | None = None,
    **settings: Any,
) -> DAG:
    """A DAG with stratoflow's run settings: fixed start date, no catch-up, one run at a time.

    Args:
        dag_id: the DAG id (from `stratoflow.config.names`).
        defaults: every task's defaults (`default_args`), e.g. from `spec_defaults`.
        params: the DAG's Params as JSON-schema keyword arguments of `airflow.sdk.Param`
            (`stratoflow.config.params`), or None for a DAG without Params.
        **settings: the rest of `DAG`'s arguments (description, doc_md, schedule, tags,
            on_failure_callback).
    """
    return DAG(
        dag_id=dag_id,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params={name: Param(**kwargs) for name, kwargs in (params or {}).items()},
        default_args=dict(defaults),
        # `stratoflow.dags.publish` puts each DAG in the DAG file's globals by name; no
        # auto-registration, so that building the DAGs only for their errors
        # (`raise_pipeline_errors`) bags none of them.
        auto_register=False,
        **settings,
    )


def spec_defaults(spec: PipelineSpec, **extra: Any) -> dict[str, Any]:
    """The task defaults a pipeline spec sets (owner, retries, retry delay), plus `extra`."""
    return {
        "owner": spec.owner,
        "retries": spec.retries,
        "retry_delay": timedelta(seconds=spec.retry_delay_seconds),
        **extra,
    }


def spec_tags(spec: PipelineSpec, *extra: str) -> list[str]:
    """The spec's tags, `stratoflow` and `extra`, sorted and without repeats."""
    return sorted({*spec.tags, "stratoflow", *extra})


def refusing_task(**task_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """`@task(**task_kwargs)` whose body fails at once, without retry, when the spec refuses it.

    A `SpecError` (an invalid conf) gives the same answer on every try: `no_retry_on_refusal`.
    """

    def decorate(body: Callable[..., Any]) -> Any:
        return task(**task_kwargs)(no_retry_on_refusal(body))

    return decorate


def airflow_run(context: Any) -> AirflowRun:
    """The DAG run of a task's Airflow context, as the task bodies take it.

    Every task body and callback starts here, so the deployment's Airflow Connections
    (`stratoflow.tasks.deployment_connections`) are applied to the process first.
    """
    from stratoflow.tasks.deployment_connections import apply_connections
    from stratoflow.tasks.run_context import AirflowRun

    apply_connections()
    return AirflowRun.from_context(context)


# The XCom key of why a task skipped itself (and, by the trigger rules, every task after it).
SKIPPED_BECAUSE_KEY = "skipped_because"


def skip_the_rest(context: Any, reason: str) -> NoReturn:
    """Skip this task and, by the default trigger rule, every task downstream of it.

    The reason shows in the task log (Airflow logs the exception's message), in the task's XCom
    `skipped_because` (the UI's XCom tab), and the DAG run succeeds.
    """
    context["ti"].xcom_push(key=SKIPPED_BECAUSE_KEY, value=reason)
    raise AirflowSkipException(reason)


# Failure callbacks. Airflow 3 calls a task's on_failure_callback only when it has failed for
# good; a failure that will be retried calls on_retry_callback instead, so a retry keeps its
# checkpoints.


def clean_up_failed_run(pipeline: str) -> Callable[[Any], None]:
    """A retrain task's failure callback: `stratoflow.tasks.clean_up.clean_up_failed_run` for its
    DAG run."""

    def clean_up_failed_run(context: Any) -> None:
        from stratoflow.tasks import clean_up

        run = airflow_run(context)
        # A refusal in the first try of the first task came before any MLflow call
        # (`stratoflow.tasks.prepare.prepare` resolves the config first): nothing to undo there.
        refused_at_once = (
            context["ti"].task_id == names.PREPARE_TASK
            and run.try_number == 1
            and isinstance(context.get("exception"), AirflowFailException)
        )
        clean_up.clean_up_failed_run(pipeline, run, tracked=not refused_at_once)

    return clean_up_failed_run


def end_runs_left_running(pipeline: str) -> Callable[[Any], None]:
    """A retrain DAG run's failure callback: end the MLflow runs its killed tasks left RUNNING.

    A task process killed outright (SIGKILL, OOM) runs no failure callback: its supervisor just
    reports the task failed. The DAG run's failure callback (run by the DAG processor) then
    finds its MLflow run still RUNNING and ends it KILLED.
    """

    def end_runs_left_running(context: Any) -> None:
        from stratoflow.tasks import clean_up
        from stratoflow.tasks.deployment_connections import apply_connections
        from stratoflow.tasks.run_context import AirflowRun

        apply_connections()
        run = AirflowRun(context["dag"].dag_id, context["run_id"])
        clean_up.clean_up_stopped_run(pipeline, run)

    return end_runs_left_running


def mark_benchmark_failed(pipeline: str) -> Callable[[Any], None]:
    """A benchmark task's failure callback: mark the benchmark's parent MLflow run FAILED."""

    def mark_parent_failed(context: Any) -> None:
        from stratoflow.tasks import strategy_benchmark

        strategy_benchmark.mark_parent_failed(pipeline, airflow_run(context))

    return mark_parent_failed
