"""MLflow: one experiment per pipeline, one run per DAG run, models in the registry.

The names here are a public interface (the README lists them): users compare runs by these tags,
params and metrics in the MLflow UI and with `stratoflow compare`.

- experiment `stratoflow/<pipeline>`; a run per DAG run, found again by the tags
  `airflow.dag_id` + `airflow.run_id` so a retried task reuses it;
- tags `strategy`, `num_replicas`, `num_workers`, `global_batch_size`, `loop`, `dataset`;
- params: the whole resolved config, flattened (`training.strategy`, `model.builder`, ...);
- metrics per epoch (step = epoch): `loss`, `accuracy`, `val_loss`, `val_accuracy`,
  `examples_per_second`; final `test_loss`, `test_accuracy`, per-class precision/recall;
- registered model from the spec; aliases `challenger` (every successful run) and `champion`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from pipelines import settings
from pipelines.spec import PipelineSpec

logger = logging.getLogger(__name__)

CHALLENGER = "challenger"
CHAMPION = "champion"
EPOCH_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second")
MODEL_URI_TAG = "stratoflow.model_uri"
VERSION_TAG = "stratoflow.registered_version"


class TrackingUnavailableError(RuntimeError):
    """The MLflow tracking server or store cannot be reached."""


def experiment_name(pipeline: str) -> str:
    return f"stratoflow/{pipeline}"


def client(tracking_uri: str | None = None) -> Any:
    """An `MlflowClient` on the explicit tracking URI (and the same registry URI)."""
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or settings.tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(mlflow_client: Any, pipeline: str) -> str:
    """The experiment id of `pipeline`, created on first use with an explicit artifact location."""
    name = experiment_name(pipeline)
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    location = None
    if mlflow_client.tracking_uri.startswith(("sqlite:", "file:", "/")):
        # A local store would otherwise put artifacts under ./mlruns of whatever cwd a task has.
        location = (settings.artifact_root() / pipeline).as_uri()
    try:
        return str(mlflow_client.create_experiment(name, artifact_location=location))
    except Exception:  # another run created it meanwhile
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


def find_run(mlflow_client: Any, pipeline: str, dag_id: str, run_id: str) -> Any | None:
    """The MLflow run of a DAG run, or None."""
    experiment = mlflow_client.get_experiment_by_name(experiment_name(pipeline))
    if experiment is None:
        return None
    runs = mlflow_client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`airflow.dag_id` = '{dag_id}' and tags.`airflow.run_id` = '{run_id}'",
        max_results=2,
    )
    return runs[0] if runs else None


def start_or_resume_run(
    spec: PipelineSpec, dag_id: str, run_id: str, try_number: int, dataset: dict[str, Any]
) -> str:
    """Return the MLflow run id of this DAG run, creating and describing the run the first time.

    Raises:
        TrackingUnavailableError: the tracking store does not answer; nothing was written.
    """
    from mlflow.entities import Param

    mlflow_client = client()
    try:
        experiment_id = ensure_experiment(mlflow_client, spec.name)
    except Exception as error:
        raise TrackingUnavailableError(
            f"MLflow at {mlflow_client.tracking_uri} is unreachable ({type(error).__name__}: "
            f"{error}); start the tracking server or fix MLFLOW_TRACKING_URI"
        ) from error
    existing = find_run(mlflow_client, spec.name, dag_id, run_id)
    if existing is not None:
        mlflow_client.update_run(existing.info.run_id, status="RUNNING")
        mlflow_client.set_tag(existing.info.run_id, "airflow.try_number", str(try_number))
        logger.info("resuming MLflow run %s of DAG run %s", existing.info.run_id, run_id)
        return str(existing.info.run_id)

    training = spec.training
    tags = {
        "airflow.dag_id": dag_id,
        "airflow.run_id": run_id,
        "airflow.try_number": str(try_number),
        "pipeline": spec.name,
        "strategy": training.strategy,
        "loop": training.loop,
        "global_batch_size": str(training.batch_size),
        "num_workers": "1",
        "dataset": f"{dataset['name']}:{dataset['version']}",
        "mlflow.runName": f"{spec.name}-{training.strategy}-{run_id}",
    }
    run = mlflow_client.create_run(experiment_id, tags=tags)
    params = [Param(key, value) for key, value in flatten_config(spec).items()]
    for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        mlflow_client.log_batch(run.info.run_id, params=params[start : start + 100])
    _log_dataset_input(mlflow_client, run.info.run_id, dataset)
    mlflow_client.log_dict(run.info.run_id, dataclasses.asdict(spec), "config.json")
    logger.info("created MLflow run %s for DAG run %s", run.info.run_id, run_id)
    return str(run.info.run_id)


def flatten_config(spec: PipelineSpec) -> dict[str, str]:
    """The resolved config as MLflow params: dotted keys, JSON for lists and mappings."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value and prefix.count(".") < 2:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        elif isinstance(value, (list, dict)):
            flat[prefix] = json.dumps(value)
        else:
            flat[prefix] = str(value)

    walk("", dataclasses.asdict(spec))
    return flat


def _log_dataset_input(mlflow_client: Any, run_id: str, dataset: dict[str, Any]) -> None:
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    source = resolve_dataset_source(str(dataset["data_dir"]))
    meta = MetaDataset(  # type: ignore[abstract]  # MLflow leaves `profile` abstract
        source,
        name=f"{dataset['name']}:{dataset['version']}",
        digest=str(dataset["fingerprint"])[:36],
    )
    inputs = [
        DatasetInput(meta._to_mlflow_entity(), [InputTag(MLFLOW_DATASET_CONTEXT, "training")])
    ]
    mlflow_client.log_inputs(run_id, datasets=inputs)


def set_tags(run_id: str, tags: dict[str, Any]) -> None:
    mlflow_client = client()
    for key, value in tags.items():
        mlflow_client.set_tag(run_id, key, str(value))


def log_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
    client().log_batch(run_id, metrics=batch)


class EpochLogger:
    """Streams each epoch's metrics into the run as the epoch ends (step = epoch), exactly once."""

    def __init__(self, tracking_uri: str, run_id: str):
        self.client = client(tracking_uri)
        self.run_id = run_id
        history = self.client.get_metric_history(run_id, "loss")
        self.logged_epochs = {metric.step for metric in history}

    def __call__(self, metrics: Any) -> None:
        values = metrics if isinstance(metrics, dict) else dataclasses.asdict(metrics)
        epoch = int(values["epoch"])
        if epoch in self.logged_epochs:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(values[key]), now, epoch) for key in EPOCH_METRICS]
        self.client.log_batch(self.run_id, metrics=batch)
        self.logged_epochs.add(epoch)

    def log_missing(self, history: Iterable[dict[str, float]]) -> None:
        """Log checkpointed epochs a previous attempt saved but did not get into MLflow."""
        for entry in history:
            self(entry)


def champion(model_name: str) -> tuple[str, float] | None:
    """The current champion's (version, test_accuracy), or None if there is no champion."""
    mlflow_client = client()
    try:
        version = mlflow_client.get_model_version_by_alias(model_name, CHAMPION)
    except Exception:  # no such model or no such alias
        return None
    run = mlflow_client.get_run(version.run_id)
    accuracy = run.data.metrics.get("test_accuracy")
    return (str(version.version), float(accuracy)) if accuracy is not None else None


def finish_run(run_id: str, status: str = "FINISHED") -> None:
    client().set_terminated(run_id, status=status)


def registered_model_name(pipeline: str) -> str:
    from pipelines.spec import load_spec

    return load_spec(pipeline).registered_model
