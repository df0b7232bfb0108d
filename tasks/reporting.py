"""Read-only views of a pipeline's MLflow runs: `make run`'s summary and `stratoflow compare`."""

from __future__ import annotations

import shlex
from typing import Any

from pipelines import settings
from tasks import tracking


def describe_dag_run(pipeline: str, dag_id: str, run_id: str | None = None) -> dict[str, Any]:
    """What one DAG run produced: test metrics, MLflow run, registered version and its aliases.

    Args:
        pipeline: the pipeline name.
        dag_id: the DAG id, e.g. "retrain_mnist".
        run_id: the Airflow run id; None means the latest run of `dag_id`.

    Raises:
        LookupError: no MLflow run exists for that DAG run.
    """
    mlflow_client = tracking.client()
    if run_id is not None:
        run = tracking.find_run(mlflow_client, pipeline, dag_id, run_id)
    else:
        runs = _search(mlflow_client, pipeline, f"tags.`airflow.dag_id` = '{dag_id}'", 1)
        run = runs[0] if runs else None
    if run is None:
        raise LookupError(
            f"no MLflow run of {dag_id} {run_id or '(latest)'} in {settings.tracking_uri()}"
        )
    spec_model = tracking.registered_model_name(pipeline)
    version = run.data.tags.get(tracking.VERSION_TAG)
    aliases: list[str] = []
    if version:
        aliases = sorted(mlflow_client.get_model_version(spec_model, version).aliases)
    return {
        "mlflow_run_id": run.info.run_id,
        "status": run.info.status,
        "test_metrics": {
            k: v for k, v in sorted(run.data.metrics.items()) if k in ("test_accuracy", "test_loss")
        },
        "registered_model": spec_model,
        "version": version,
        "aliases": aliases,
        "gate": run.data.tags.get("gate.reasons"),
        "ui_command": ui_command(),
    }


def compare_runs(pipeline: str, limit: int = 10) -> list[dict[str, Any]]:
    """The `limit` most recent runs of `pipeline`, newest first, with what users compare them by."""
    mlflow_client = tracking.client()
    champion = tracking.champion(tracking.registered_model_name(pipeline))
    rows = []
    for run in _search(mlflow_client, pipeline, "", limit):
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        duration = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else None
        version = tags.get(tracking.VERSION_TAG)
        rows.append(
            {
                "run_id": run.info.run_id,
                "airflow_run_id": tags.get("airflow.run_id"),
                "status": run.info.status,
                "strategy": tags.get("strategy"),
                "replicas": tags.get("num_replicas"),
                "workers": tags.get("num_workers"),
                "loop": tags.get("loop"),
                "epochs": params.get("training.epochs"),
                "test_accuracy": metrics.get("test_accuracy"),
                "examples_per_second": metrics.get("examples_per_second"),
                "duration_s": duration,
                "version": version,
                "champion": bool(champion and version == champion[0]),
            }
        )
    return rows


def ui_command() -> str:
    """The command that opens the MLflow UI on the configured store."""
    uri = settings.tracking_uri()
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)} --port 5000"


def _search(mlflow_client: Any, pipeline: str, filter_string: str, limit: int) -> list[Any]:
    experiment = mlflow_client.get_experiment_by_name(tracking.experiment_name(pipeline))
    if experiment is None:
        return []
    return list(
        mlflow_client.search_runs(
            [experiment.experiment_id],
            filter_string=filter_string,
            order_by=["attributes.start_time DESC"],
            max_results=limit,
        )
    )
