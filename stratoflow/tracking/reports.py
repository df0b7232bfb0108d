"""Read-only views of a pipeline's MLflow runs: `make run`'s summary and `stratoflow compare`."""

from __future__ import annotations

import json
import shlex
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stratoflow.config import locations, names
from stratoflow.tracking import mlflow_runs

# Where `mlflow ui` serves by default (the address `ui_command` starts it on).
DEFAULT_UI_URL = "http://127.0.0.1:5000"


def describe_dag_run(pipeline: str, dag_id: str, run_id: str | None = None) -> dict[str, Any]:
    """What one DAG run produced: test metrics, MLflow run, registered version and its aliases.

    Args:
        pipeline: the pipeline name.
        dag_id: the DAG id, e.g. "retrain_mnist".
        run_id: the Airflow run id; None means the latest run of `dag_id`.

    Raises:
        LookupError: no MLflow run exists for that DAG run.
    """
    mlflow_client = mlflow_runs.client()
    if run_id is not None:
        run = mlflow_runs.find_run(mlflow_client, pipeline, dag_id, run_id)
    else:
        runs = _search(mlflow_client, pipeline, f"tags.`{names.DAG_ID_TAG}` = '{dag_id}'", 1)
        run = runs[0] if runs else None
    if run is None:
        raise LookupError(
            f"no MLflow run of {dag_id} {run_id or '(latest)'} in {locations.tracking_uri()}"
        )
    spec_model = mlflow_runs.registered_model_name(pipeline)
    version = run.data.tags.get(names.VERSION_TAG)
    aliases: list[str] = []
    if version:
        aliases = sorted(mlflow_client.get_model_version(spec_model, version).aliases)
    return {
        "mlflow_run_id": run.info.run_id,
        "status": run.info.status,
        "test_metrics": {
            k: v
            for k, v in sorted(run.data.metrics.items())
            if k in ("test_accuracy", "test_loss", "test_mae", "test_rmse")
        },
        "registered_model": spec_model,
        "version": version,
        "aliases": aliases,
        "gate": run.data.tags.get("gate.reasons"),
        "ui_command": ui_command(),
    }


def compare_runs(
    pipeline: str, limit: int = 10, run_ids: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """A pipeline's runs, newest first, with what users compare them by.

    Args:
        pipeline: the pipeline name.
        limit: how many of the newest retrain runs (ignored when `run_ids` is given).
        run_ids: exactly these MLflow runs of the pipeline instead.

    Raises:
        LookupError: a run id of `run_ids` is not a run of the pipeline.
    """
    mlflow_client = mlflow_runs.client()
    champion = mlflow_runs.champion(mlflow_runs.registered_model_name(pipeline))
    if run_ids:
        quoted = ", ".join(f"'{run_id}'" for run_id in run_ids)
        runs = _search(mlflow_client, pipeline, f"attributes.run_id IN ({quoted})", len(run_ids))
        missing = sorted(set(run_ids) - {run.info.run_id for run in runs})
        if missing:
            raise LookupError(
                f"not a run of pipeline {pipeline} in {locations.tracking_uri()}: "
                f"{', '.join(missing)}"
            )
    else:
        # The retrain runs only: a strategy benchmark's runs are in the same experiment, and
        # `run_ids` picks them.
        retrain = f"tags.`{names.DAG_ID_TAG}` = '{names.retrain_dag_id(pipeline)}'"
        runs = _search(mlflow_client, pipeline, retrain, limit)
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        duration = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else None
        version = tags.get(names.VERSION_TAG)
        rows.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "experiment_id": run.info.experiment_id,
                "airflow_run_id": tags.get(names.RUN_ID_TAG),
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


def plot_validation_curves(rows: Sequence[dict[str, Any]], path: str | Path) -> list[str]:
    """Write one PNG overlaying the runs' val_loss and val_accuracy per epoch, a line per run.

    Args:
        rows: runs as `compare_runs` returns them; each line is labelled with the run name,
            strategy and replicas.
        path: where to write the PNG.

    Returns:
        The run ids drawn (runs without any epoch logged have no line).
    """
    from stratoflow.tracking import plots

    mlflow_client = mlflow_runs.client()
    drawn, curves = [], []
    for row in rows:
        history = _validation_history(mlflow_client, row["run_id"])
        if history:
            drawn.append(row["run_id"])
            label = f"{row['run_name']} ({row['strategy']}, replicas {row['replicas'] or '?'})"
            curves.append((label, history))
    plots.save_png(plots.validation_curves(curves), path)
    return drawn


def compare_url(run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """The MLflow UI page comparing `run_ids` side by side (MLflow 3's `#/compare-runs`)."""
    # The same unescaped JSON the UI itself puts in this link.
    runs = json.dumps(list(run_ids), separators=(",", ":"))
    experiments = json.dumps(sorted(set(experiment_ids)), separators=(",", ":"))
    query = f"runs={runs}&experiments={experiments}"
    return f"{ui_base_url()}/#/compare-runs?{query}"


def serves_ui() -> bool:
    """Whether the tracking URI is a server (which serves the UI) rather than a local store."""
    return locations.tracking_uri().startswith(("http://", "https://"))


def ui_base_url() -> str:
    """The MLflow UI's address: the tracking server's, else where `mlflow ui` serves by default."""
    return locations.tracking_uri().rstrip("/") if serves_ui() else DEFAULT_UI_URL


def ui_command() -> str:
    """The command that opens the MLflow UI on the configured store."""
    uri = locations.tracking_uri()
    if serves_ui():
        return f"open {uri}"
    port = urllib.parse.urlsplit(DEFAULT_UI_URL).port
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)} --port {port}"


def _validation_history(mlflow_client: Any, run_id: str) -> list[dict[str, float]]:
    by_epoch: dict[int, dict[str, float]] = {}
    # `val_mae` for a regression pipeline: a run holds one of the two.
    for key in ("val_loss", "val_accuracy", "val_mae"):
        for metric in mlflow_client.get_metric_history(run_id, key):
            by_epoch.setdefault(metric.step, {"epoch": metric.step})[key] = metric.value
    return [by_epoch[epoch] for epoch in sorted(by_epoch) if len(by_epoch[epoch]) == 3]


def _search(mlflow_client: Any, pipeline: str, filter_string: str, limit: int) -> list[Any]:
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
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
