"""Clean-up after a DAG run failed or was stopped: its MLflow runs, model versions and folder.

The retrain DAG's failure callbacks (`stratoflow/dags/factory.py`) and `stratoflow run`'s stop
handling call these; they take the pipeline and the DAG run, never a task's result (the task may
not have any), and read no pipeline spec (it may have changed since the run, or no longer load):
the MLflow runs are found by the DAG run's tags in the pipeline's experiment, and the registered
model is the one the run's plan named, as the run recorded it (its `registered_model` param).
"""

from __future__ import annotations

import logging
from typing import Any

from stratoflow.config import locations
from stratoflow.tasks.run_context import AirflowRun

# The run's resolved config is logged as params (`mlflow_runs.flatten_config`): its model's name.
REGISTERED_MODEL_PARAM = "registered_model"

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
        mlflow_client = mlflow_runs.client()
        mlflow_run = mlflow_runs.find_run(mlflow_client, pipeline, run.dag_id, run.run_id)
        if mlflow_run is None:
            return
        model_registry.delete_versions_of_run(_registered_model(mlflow_run), mlflow_run.info.run_id)
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
    mlflow_client = mlflow_runs.client()
    for mlflow_run_id in ended:
        model = _registered_model(mlflow_client.get_run(mlflow_run_id))
        model_registry.delete_versions_of_run(model, mlflow_run_id)
    return ended


def _registered_model(mlflow_run: Any) -> str:
    """The registered model the run's plan named (logged with the run's resolved config)."""
    return str(mlflow_run.data.params.get(REGISTERED_MODEL_PARAM, ""))
