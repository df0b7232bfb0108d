"""MLflow: one experiment per pipeline, one run per DAG run, models in the registry.

The names here are a public interface (docs/reference/mlflow-names.md lists them): users compare
runs by these tags, params and metrics in the MLflow UI and with `stratoflow compare`.

- experiment `stratoflow/<pipeline>`; a run per DAG run, found again by the tags
  `airflow.dag_id` + `airflow.run_id` so a retried task reuses it; its user is the MLflow
  account it logs as (the OS user for a local store), `airflow.triggered_by` the Airflow user
  who triggered the DAG run;
- tags `strategy`, `num_replicas`, `num_workers`, `global_batch_size`, `loop`, `dataset`;
- params: the whole resolved config, flattened (`training.strategy`, `model.builder`, ...);
- metrics per epoch (step = epoch): `loss`, `accuracy`, `val_loss`, `val_accuracy` (`mae`,
  `val_mae` for regression), `examples_per_second`; final `test_loss`, `test_accuracy`,
  per-class precision/recall (regression: `test_mae`, `test_rmse`);
  `system/...` (CPU, memory) sampled during training;
- artifacts: `config.json` + `config.yaml`, `environment.json`, `curves.png`,
  `confusion_matrix.png`, `evaluation/per_class.json`, `evaluation/test_metrics.json`;
- registered model from the spec; aliases `challenger` (every successful run) and `champion`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import time
from collections.abc import Iterable
from typing import Any

from stratoflow.config import locations, names
from stratoflow.config.spec import PipelineSpec

logger = logging.getLogger(__name__)

REACHABILITY_ATTEMPTS = 3
REACHABILITY_TIMEOUT_SECONDS = 5.0
REACHABILITY_PAUSE_SECONDS = 2.0


class TrackingUnavailableError(RuntimeError):
    """The MLflow tracking server or store cannot be reached."""


def check_reachable(tracking_uri: str | None = None, attempts: int = REACHABILITY_ATTEMPTS) -> None:
    """Fail in seconds when an MLflow tracking server does not answer its health check.

    MLflow's own client retries a refused connection with backoff for minutes before it fails;
    a run that cannot be tracked should say so before it prepares data or trains. Local stores
    (SQLite, files) are not checked here.

    Raises:
        TrackingUnavailableError: the server did not answer `attempts` times; the message
            names the URI.
    """
    import urllib.error
    import urllib.request

    uri = tracking_uri or locations.tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    problem = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(REACHABILITY_PAUSE_SECONDS)
        try:
            with urllib.request.urlopen(
                f"{uri.rstrip('/')}/health", timeout=REACHABILITY_TIMEOUT_SECONDS
            ) as response:
                if response.status == 200:
                    return
                problem = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError) as error:
            problem = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
    raise TrackingUnavailableError(
        f"MLflow at {uri} is unreachable ({problem}, {attempts} attempts); start the tracking "
        f"server or fix {locations.TRACKING_URI_ENV}"
    )


def client(tracking_uri: str | None = None) -> Any:
    """An `MlflowClient` on the explicit tracking URI (and the same registry URI)."""
    import mlflow
    from mlflow import MlflowClient

    uri = tracking_uri or locations.tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(mlflow_client: Any, pipeline: str) -> str:
    """The experiment id of `pipeline`, created on first use with an explicit artifact location."""
    name = names.experiment_name(pipeline)
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    location = None
    if mlflow_client.tracking_uri.startswith(("sqlite:", "file:", "/")):
        # A local store would otherwise put artifacts under ./mlruns of whatever cwd a task has.
        location = (locations.artifact_root() / pipeline).as_uri()
    try:
        return str(mlflow_client.create_experiment(name, artifact_location=location))
    except Exception:  # another run created it meanwhile
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return str(experiment.experiment_id)


def find_run(mlflow_client: Any, pipeline: str, dag_id: str, run_id: str) -> Any | None:
    """The MLflow run of a DAG run, or None."""
    return find_tagged_run(
        mlflow_client, pipeline, {names.DAG_ID_TAG: dag_id, names.RUN_ID_TAG: run_id}
    )


def find_tagged_run(mlflow_client: Any, pipeline: str, tags: dict[str, str]) -> Any | None:
    """The run of `pipeline`'s experiment that carries every tag in `tags`, or None."""
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
    if experiment is None:
        return None
    runs = mlflow_client.search_runs(
        [experiment.experiment_id],
        filter_string=" and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items()),
        max_results=2,
    )
    return runs[0] if runs else None


def start_or_resume_run(
    spec: PipelineSpec,
    dag_id: str,
    run_id: str,
    try_number: int,
    dataset: dict[str, Any],
    *,
    triggered_by: str = "",
) -> str:
    """Return the MLflow run id of this DAG run, creating and describing the run the first time.

    Args:
        spec: the run's configuration.
        dag_id: the DAG run's DAG.
        run_id: the DAG run's id.
        try_number: the task's try.
        dataset: the prepared dataset's reference, as a dict.
        triggered_by: what `airflow.triggered_by` records (no tag when empty: not an Airflow
            run).

    Raises:
        TrackingUnavailableError: the tracking store does not answer; nothing was written.
    """
    identity = {names.DAG_ID_TAG: dag_id, names.RUN_ID_TAG: run_id}
    tags = {
        **training_tags(spec, dataset),
        names.RUN_NAME_TAG: f"{spec.name}-{spec.training.strategy}-{run_id}",
        **triggered_by_tag(triggered_by),
    }
    return start_or_resume_tagged_run(spec, identity, tags, try_number, dataset)


def start_or_resume_tagged_run(
    spec: PipelineSpec,
    identity: dict[str, str],
    tags: dict[str, str],
    try_number: int,
    dataset: dict[str, Any],
) -> str:
    """The run of `spec`'s experiment carrying the `identity` tags, created the first time.

    A new run gets `identity`, `tags`, `airflow.try_number`, the flattened config as params, the
    dataset as input and `config.json`; an existing one is set RUNNING again with the new try.

    Raises:
        TrackingUnavailableError: the tracking store does not answer; nothing was written.
    """
    mlflow_client = client()
    try:
        experiment_id = ensure_experiment(mlflow_client, spec.name)
    except Exception as error:
        raise TrackingUnavailableError(
            f"MLflow at {mlflow_client.tracking_uri} is unreachable ({type(error).__name__}: "
            f"{error}); start the tracking server or fix MLFLOW_TRACKING_URI"
        ) from error
    existing = find_tagged_run(mlflow_client, spec.name, identity)
    if existing is not None:
        mlflow_client.update_run(existing.info.run_id, status="RUNNING")
        mlflow_client.set_tag(existing.info.run_id, names.TRY_NUMBER_TAG, str(try_number))
        logger.info("resuming MLflow run %s (%s)", existing.info.run_id, identity)
        return str(existing.info.run_id)
    all_tags = {**identity, names.TRY_NUMBER_TAG: str(try_number), **tags}
    return create_described_run(mlflow_client, experiment_id, spec, all_tags, dataset)


def triggered_by_tag(triggered_by: str) -> dict[str, str]:
    """`airflow.triggered_by` as a tag, or no tag for a run made outside Airflow (empty)."""
    return {names.TRIGGERED_BY_TAG: triggered_by} if triggered_by else {}


def training_tags(spec: PipelineSpec, dataset: dict[str, Any]) -> dict[str, str]:
    """The tags describing a training run: pipeline, strategy, loop, batch, dataset."""
    training = spec.training
    return {
        "pipeline": spec.name,
        "strategy": training.strategy,
        "loop": training.loop,
        "global_batch_size": str(training.batch_size),
        "num_workers": "1",
        "dataset": f"{dataset['name']}:{dataset['version']}",
    }


def create_described_run(
    mlflow_client: Any,
    experiment_id: str,
    spec: PipelineSpec,
    tags: dict[str, str],
    dataset: dict[str, Any],
) -> str:
    """Create a run with `tags`, the flattened config as params, the dataset input, config.json.

    The run's user (`mlflow.user`) is the MLflow account the client signs in as, or the OS user
    (MLflow's own fluent API does the same; its client API leaves runs 'unknown').
    """
    from mlflow.entities import Param

    run = mlflow_client.create_run(experiment_id, tags={names.USER_TAG: tracking_user(), **tags})
    params = [Param(key, value) for key, value in flatten_config(spec).items()]
    for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        mlflow_client.log_batch(run.info.run_id, params=params[start : start + 100])
    _log_dataset_input(mlflow_client, run.info.run_id, dataset)
    _log_config(mlflow_client, run.info.run_id, spec)
    logger.info("created MLflow run %s (%s)", run.info.run_id, tags.get(names.RUN_NAME_TAG))
    return str(run.info.run_id)


def tracking_user() -> str:
    """Who logs: the MLflow user of the client's credentials, else the OS user."""
    import getpass

    from mlflow.utils.credentials import read_mlflow_creds

    return read_mlflow_creds().username or getpass.getuser()


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


def _log_config(mlflow_client: Any, run_id: str, spec: PipelineSpec) -> None:
    """The resolved config whole: YAML to read in the UI, JSON for programs (both kept)."""
    import yaml

    config = dataclasses.asdict(spec)
    mlflow_client.log_dict(run_id, config, names.CONFIG_JSON_ARTIFACT)
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    mlflow_client.log_text(run_id, text, names.CONFIG_YAML_ARTIFACT)


def _log_dataset_input(mlflow_client: Any, run_id: str, dataset: dict[str, Any]) -> None:
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    source = resolve_dataset_source(str(dataset.get("image_folder") or dataset["data_dir"]))
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


def log_params(run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    client().log_batch(run_id, params=[Param(key, str(value)) for key, value in params.items()])


def log_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
    client().log_batch(run_id, metrics=batch)


def log_figure(run_id: str, figure: Any, artifact_file: str) -> None:
    """Log a matplotlib figure as a PNG artifact (replacing an earlier attempt's) and close it."""
    import matplotlib.pyplot as plt

    try:
        client().log_figure(run_id, figure, artifact_file)
    finally:
        plt.close(figure)


def load_json_artifact(run_id: str, artifact_file: str) -> Any:
    """A JSON artifact of run `run_id` (e.g. `data/statistics.json`), read back.

    Raises:
        OSError, MlflowException: the run has no such artifact, or it cannot be read.
    """
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="stratoflow-artifact-") as folder:
        path = client().download_artifacts(run_id, artifact_file, folder)
        return json.loads(Path(path).read_text())


def log_table(run_id: str, columns: dict[str, list[Any]], artifact_file: str) -> None:
    """Log a table artifact (shown as a table in the MLflow UI), replacing an earlier one.

    MLflow's `log_table` appends to a table that already exists; a retried task must not
    duplicate the rows, so a second call overwrites the file in the same format instead.
    """
    import pandas as pd

    mlflow_client = client()
    frame = pd.DataFrame(columns)
    folder = posixpath.dirname(artifact_file) or None
    if artifact_file in {item.path for item in mlflow_client.list_artifacts(run_id, folder)}:
        mlflow_client.log_text(run_id, frame.to_json(orient="split", index=False), artifact_file)
    else:
        mlflow_client.log_table(run_id, frame, artifact_file)


class EpochLogger:
    """Streams each epoch's metrics into the run as the epoch ends (step = epoch), exactly once."""

    def __init__(self, tracking_uri: str, run_id: str):
        self.client = client(tracking_uri)
        self.run_id = run_id
        history = self.client.get_metric_history(run_id, "loss")
        self.logged_epochs = {metric.step for metric in history}

    def __call__(self, metrics: Any) -> None:
        values = metrics if isinstance(metrics, dict) else metrics.to_dict()
        epoch = int(values["epoch"])
        if epoch in self.logged_epochs:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # The objective names the epoch metric (`accuracy`, `mae`): every value but the epoch
        # itself and its duration is a metric.
        batch = [
            Metric(key, float(value), now, epoch)
            for key, value in values.items()
            if key not in ("epoch", "seconds")
        ]
        self.client.log_batch(self.run_id, metrics=batch)
        self.logged_epochs.add(epoch)

    def log_missing(self, history: Iterable[dict[str, float]]) -> None:
        """Log checkpointed epochs a previous attempt saved but did not get into MLflow."""
        for entry in history:
            self(entry)


def champion(model_name: str, metric: str = "test_accuracy") -> tuple[str, float] | None:
    """The current champion's (version, value of test `metric`), or None without a champion."""
    found = champion_metrics(model_name)
    if found is None or metric not in found[1]:
        return None
    return found[0], found[1][metric]


def champion_metrics(model_name: str) -> tuple[str, dict[str, float]] | None:
    """The current champion's version and every metric of the run that made it (test metrics,
    slice metrics), or None without a champion."""
    mlflow_client = client()
    try:
        version = mlflow_client.get_model_version_by_alias(model_name, names.CHAMPION)
    except Exception:  # no such model or no such alias
        return None
    run = mlflow_client.get_run(version.run_id)
    return str(version.version), {key: float(value) for key, value in run.data.metrics.items()}


def finish_run(run_id: str, status: str = "FINISHED") -> None:
    client().set_terminated(run_id, status=status)


def end_unfinished_runs(
    pipeline: str, dag_id: str, run_id: str, status: str = "KILLED"
) -> list[str]:
    """End every MLflow run of a DAG run that is still RUNNING (a benchmark has several).

    For a DAG run whose processes were killed: nothing of it will ever finish these runs.

    Returns:
        The ids of the runs it ended with `status`.
    """
    mlflow_client = client()
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
    if experiment is None:
        return []
    runs = mlflow_client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{names.DAG_ID_TAG}` = '{dag_id}' and tags.`{names.RUN_ID_TAG}` = "
        f"'{run_id}' and attributes.status = 'RUNNING'",
    )
    for run in runs:
        mlflow_client.set_terminated(run.info.run_id, status=status)
    return [str(run.info.run_id) for run in runs]


def registered_model_name(pipeline: str) -> str:
    from stratoflow.config.spec import load_spec

    return load_spec(pipeline).registered_model
