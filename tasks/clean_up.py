"""Clean-up after a DAG run failed or was stopped: its MLflow runs, model versions and folder.

The retrain DAG's failure callbacks (`dags/factory.py`) and `stratoflow run`'s stop handling call
these; they take the pipeline and the DAG run, never a task's result (the task may not have any).
"""

from __future__ import annotations

import logging

from stratoflow.config import locations
from stratoflow.config.spec import load_spec
from tasks.run_context import AirflowRun

logger = logging.getLogger(__name__)


def clean_up_failed_run(pipeline: str, run: AirflowRun, tracked: bool = True) -> None:
    """After a task failed for good: mark its MLflow run failed, remove versions and checkpoints.

    Best effort: it runs in a failure callback, so it logs what it cannot undo instead of raising.

    Args:
        pipeline: the pipeline name.
        run: the failed DAG run.
        tracked: False when the run failed before any MLflow call (its first task refused the
            conf): only its folder is removed, and MLflow is not asked (importing and
            connecting to it is most of this callback's time).
    """
    locations.remove_run_dir(run.dag_id, run.run_id)
    if not tracked:
        return
    from stratoflow.tracking import mlflow_runs, model_registry

    try:
        mlflow_runs.check_reachable()
    except mlflow_runs.TrackingUnavailableError as error:
        # MLflow's own client would retry for minutes inside this callback: report and stop.
        logger.error(
            "cannot mark the MLflow run of %s failed or remove its model versions: %s",
            run.run_id,
            error,
        )
        return
    try:
        spec = load_spec(pipeline)
        mlflow_client = mlflow_runs.client()
        mlflow_run = mlflow_runs.find_run(mlflow_client, pipeline, run.dag_id, run.run_id)
        if mlflow_run is None:
            return
        model_registry.delete_versions_of_run(spec.registered_model, mlflow_run.info.run_id)
        mlflow_runs.finish_run(mlflow_run.info.run_id, status="FAILED")
    except Exception:
        logger.exception("could not clean up MLflow after the failed DAG run %s", run.run_id)


def clean_up_stopped_run(pipeline: str, run: AirflowRun) -> list[str]:
    """After a DAG run's processes were killed from outside: end its MLflow runs KILLED.

    `stratoflow run` calls it when stopped (Ctrl-C, SIGTERM), and for a DAG run an earlier,
    SIGKILLed `stratoflow run` left behind. Like `clean_up_failed_run`, it also removes the
    versions those runs registered and the DAG run's working folder (nothing can resume it).

    Returns:
        The ids of the MLflow runs it marked KILLED.

    Raises:
        TrackingUnavailableError: MLflow does not answer (the folder is removed all the same).
    """
    from stratoflow.tracking import mlflow_runs, model_registry

    locations.remove_run_dir(run.dag_id, run.run_id)
    mlflow_runs.check_reachable()
    ended = mlflow_runs.end_unfinished_runs(pipeline, run.dag_id, run.run_id, status="KILLED")
    model = load_spec(pipeline).registered_model
    for mlflow_run_id in ended:
        model_registry.delete_versions_of_run(model, mlflow_run_id)
    return ended
