"""The retrain DAG's task bodies (`stratoflow.tasks.prepare`, `train`, `evaluate`, `register`,
`refresh`,
`clean_up`) chained as Airflow would chain them, without Airflow: each result goes through JSON
as through XCom, real child training processes, a real SQLite MLflow store, real signals for the
fault tests."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from stratoflow.config import locations, names
from stratoflow.config.parsing import SpecError
from stratoflow.tasks.run_context import AirflowRun
from tests.support.calls import counting_calls
from tests.support.images import png_size
from tests.support.processes import restorable_epoch


def through_xcom(result):
    """`result` as the next task gets it: `to_dict()`, JSON there and back, `from_dict()`."""
    return type(result).from_dict(json.loads(json.dumps(result.to_dict())))


def new_run(pipeline: str) -> AirflowRun:
    return AirflowRun(dag_id=f"retrain_{pipeline}", run_id=f"manual__{uuid.uuid4().hex[:12]}")


def training_children() -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if "stratoflow.training.worker" in " ".join(child.cmdline())
    ]


class _Lines(logging.Handler):
    """Keeps each log record's arrival time and text."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.getMessage()))


# System metrics every 0.25 s (MLflow's variable, read by the training child): several samples
# fall inside even a short training run.
SAMPLING_SECONDS = 0.25


@pytest.fixture(scope="module")
def digits_run(tf_runtime):
    """The four tasks of a 6-epoch digits run, with the training child's output as it arrived
    (TensorFlow's warnings included), what MLflow logged while the model was registered, and
    how often the run's training settings were checked (`check_training`) and its spec parsed
    (`parse_spec`) in this process.

    Each task gets its inputs as Airflow hands them over: the JSON of the XCom, read anew."""
    from stratoflow.config.spec import parse_spec
    from stratoflow.config.training import check_training
    from stratoflow.tasks import evaluate, prepare, register, train
    from stratoflow.tasks.prepare import PreparedDataset
    from stratoflow.tracking import system_metrics

    def prepared_from(xcom: dict[str, Any]) -> Any:
        return PreparedDataset.from_dict(json.loads(json.dumps(xcom)))

    launcher_log = logging.getLogger("stratoflow.distributed.launcher")
    lines, level = _Lines(), launcher_log.level
    launcher_log.addHandler(lines)
    launcher_log.setLevel(logging.INFO)
    patch = pytest.MonkeyPatch()
    patch.setenv(system_metrics.INTERVAL_ENV, str(SAMPLING_SECONDS))
    patch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # the child shows TensorFlow's warnings (W lines)
    with counting_calls(check_training) as checks, counting_calls(parse_spec) as parses:
        try:
            run = new_run("digits")
            params = {"epochs": 6}
            prepared_xcom = prepare.prepare("digits", params, run).to_dict()
            trained = through_xcom(train.train(run, prepared_from(prepared_xcom)))
        finally:
            patch.undo()
            launcher_log.removeHandler(lines)
            launcher_log.setLevel(level)
        evaluated = through_xcom(evaluate.evaluate(run, prepared_from(prepared_xcom), trained))
        mlflow_log, mlflow_lines = logging.getLogger("mlflow"), _Lines()
        mlflow_log.addHandler(mlflow_lines)
        try:
            registered = through_xcom(
                register.log_and_register(run, prepared_from(prepared_xcom), trained, evaluated)
            )
        finally:
            mlflow_log.removeHandler(mlflow_lines)
    prepared = prepared_from(prepared_xcom)
    return (
        run,
        prepared,
        trained,
        evaluated,
        registered,
        lines.records,
        mlflow_lines.records,
        checks[0],
        parses[0],
    )


@pytest.mark.integration
def test_digits_pipeline_end_to_end(digits_run):
    from stratoflow.tracking import mlflow_runs

    run, prepared, trained, evaluated, registered, *_ = digits_run
    assert trained.mlflow_run_id == prepared.mlflow_run_id
    mlflow_client = mlflow_runs.client()
    mlflow_run = mlflow_client.get_run(trained.mlflow_run_id)
    assert mlflow_run.info.status == "FINISHED"
    for metric in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second"):
        steps_logged = [
            m.step for m in mlflow_client.get_metric_history(mlflow_run.info.run_id, metric)
        ]
        assert sorted(steps_logged) == [1, 2, 3, 4, 5, 6], metric
    losses = [
        m.value
        for m in sorted(
            mlflow_client.get_metric_history(mlflow_run.info.run_id, "loss"), key=lambda m: m.step
        )
    ]
    assert losses[-1] < losses[0]
    assert evaluated.test_metrics["test_accuracy"] >= 0.9
    assert mlflow_run.data.metrics["test_accuracy"] == pytest.approx(
        evaluated.test_metrics["test_accuracy"]
    )
    assert "test_recall_class_9" in mlflow_run.data.metrics
    assert mlflow_run.data.tags["num_replicas"] == "1"
    assert registered.version == mlflow_run.data.tags[names.VERSION_TAG]
    assert "challenger" in registered.aliases
    assert registered.mlflow_run_id == mlflow_run.info.run_id
    assert not (locations.run_dir(run.dag_id, run.run_id) / "checkpoints").exists()


@pytest.mark.integration
def test_a_run_checks_its_training_settings_once(digits_run):
    """Resolved once by the first task; the later tasks (and the training process, which reads
    the plan the same way: `tests/unit/stratoflow/config/test_run_plan.py`) take it as it is."""
    checks, parses = digits_run[7], digits_run[8]
    assert checks == 1, f"check_training ran {checks} times in one run's task process"
    assert parses == 1, f"the spec was parsed {parses} times in one run's task process"


@pytest.mark.integration
def test_the_run_carries_its_curves_confusion_matrix_tables_config_and_environment(
    digits_run, tmp_path
):
    import matplotlib.image
    import yaml

    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.tracking import mlflow_runs

    run, prepared, trained, *_ = digits_run
    mlflow_client = mlflow_runs.client()
    folder = Path(mlflow_client.download_artifacts(trained.mlflow_run_id, "", str(tmp_path)))

    for name in (names.CURVES_ARTIFACT, names.CONFUSION_MATRIX_ARTIFACT):
        width, height = png_size((folder / name).read_bytes())
        assert width >= 600 and height >= 400, name
        pixels = matplotlib.image.imread(folder / name)
        assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50, name  # drawn

    table = json.loads((folder / names.PER_CLASS_ARTIFACT).read_text())
    assert table["columns"] == ["class", "name", "precision", "recall", "support"]
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert [row["class"] for row in rows] == list(range(10))
    assert sum(row["support"] for row in rows) == prepared.dataset.split_sizes["test"]
    metrics = mlflow_client.get_run(trained.mlflow_run_id).data.metrics
    for row in rows:
        assert row["recall"] == pytest.approx(metrics[f"test_recall_class_{row['class']}"])
    test_metrics = json.loads((folder / names.TEST_METRICS_ARTIFACT).read_text())
    assert np.trace(test_metrics["confusion_matrix"]) == round(
        metrics["test_accuracy"] * prepared.dataset.split_sizes["test"]
    )
    logged = json.loads(
        mlflow_client.get_run(trained.mlflow_run_id).data.tags["mlflow.loggedArtifacts"]
    )
    assert {"path": names.PER_CLASS_ARTIFACT, "type": "table"} in logged  # a table in the UI

    # The configuration the run logged is the one its tasks passed on, resolved once.
    resolved = dataclasses.asdict(resolve_plan("digits", {"epochs": 6}).spec)
    assert dataclasses.asdict(prepared.plan.spec) == resolved
    config = yaml.safe_load((folder / names.CONFIG_YAML_ARTIFACT).read_text())
    assert config == resolved
    assert config["training"]["epochs"] == 6
    assert json.loads((folder / names.CONFIG_JSON_ARTIFACT).read_text()) == resolved

    environment = json.loads((folder / names.ENVIRONMENT_ARTIFACT).read_text())
    assert (environment["strategy"], environment["num_replicas"]) == ("one_device", 1)
    assert environment["num_workers"] == environment["cluster"]["workers"] == 1
    assert environment["cluster"]["jobs"] == {}
    assert environment["devices"]["logical"] == ["/device:CPU:0"]  # the child's, not pytest's
    assert environment["versions"]["tensorflow (runtime)"] == tf_version()
    for package in ("keras", "mlflow", "apache-airflow"):
        assert environment["versions"][package], package
    assert environment["host"]["cpu_count"] >= 1


def tf_version() -> str:
    import tensorflow as tf

    return str(tf.__version__)


@pytest.mark.integration
def test_system_metrics_are_sampled_into_the_run_while_it_trains(digits_run):
    from stratoflow.tracking import mlflow_runs

    run_id = digits_run[2].mlflow_run_id
    mlflow_client = mlflow_runs.client()
    cpu = mlflow_client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    memory = mlflow_client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert cpu and memory
    assert all(0 <= metric.value <= 100 for metric in cpu)
    assert all(metric.value > 100 for metric in memory)  # megabytes used by a real host
    # Sampled during training, every SAMPLING_SECONDS: several samples, one step each, between
    # the run's start and the end of the last epoch (not only the one flushed as training ends).
    epochs = sorted(m.timestamp for m in mlflow_client.get_metric_history(run_id, "loss"))
    started = mlflow_client.get_run(run_id).info.start_time
    during = sorted(m.timestamp for m in cpu if started <= m.timestamp <= epochs[-1])
    assert len(during) >= 3, (len(cpu), during, epochs)
    assert any(epochs[0] < timestamp < epochs[-1] for timestamp in during), (during, epochs)
    assert len({m.step for m in cpu}) == len(cpu)
    gaps = np.diff(during) / 1000
    # MLflow's default is 10 s and ours 2 s: the variable was honoured (a sample also waits for
    # its write and a read of the run, so gaps exceed the interval under load).
    assert np.median(gaps) < 1.5, gaps


@pytest.mark.integration
def test_each_epoch_writes_one_progress_line_to_the_task_log_as_it_ends(digits_run):
    from stratoflow.tracking import mlflow_runs

    trained, records = digits_run[2], digits_run[5]
    progress = [
        (arrived, line)
        for arrived, line in records
        if "stratoflow.training.progress: epoch " in line
    ]
    line_format = re.compile(
        r"epoch (\d)/6: loss \d+\.\d{4}, accuracy [01]\.\d{4}, val_loss \d+\.\d{4}, "
        r"val_accuracy [01]\.\d{4}, [\d,]+ examples/s, ETA \d+:\d\d:\d\d$"
    )
    epochs = [line_format.search(line) for _, line in progress]
    assert all(epochs), [line for _, line in progress]
    assert [int(match.group(1)) for match in epochs if match] == [1, 2, 3, 4, 5, 6]
    # Streamed, not buffered until the child exits: epoch 1's line reached the task's log
    # before epoch 6 had even ended (its metrics' timestamp, on the same clock).
    history = mlflow_runs.client().get_metric_history(trained.mlflow_run_id, "loss")
    last_epoch_logged = max(metric.timestamp for metric in history) / 1000
    assert progress[0][0] < last_epoch_logged


@pytest.mark.integration
def test_a_successful_run_says_nothing_misleading(digits_run):
    """No warning about what is fine: a cache left half-read by the size estimate, a model
    "without signature" (its signature is logged); the cache decision names the file it reads."""
    training = [line for _, line in digits_run[5]]
    registering = [line for _, line in digits_run[6]]
    assert not [line for line in training if "did not fully read the dataset being cached" in line]
    assert not [line for line in registering if "without specifying model signature" in line]
    decisions = [line for line in training if "stratoflow.data.input_pipeline: " in line]
    assert len(decisions) == 2, decisions
    assert all(", from 1 file, budget " in line for line in decisions), decisions


@pytest.mark.integration
def test_a_killed_training_process_fails_fast_and_the_retry_resumes(tf_runtime):
    """SIGKILL the training child after its first checkpoint; the retry resumes at epoch 2."""
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import prepare, train
    from stratoflow.tracking import mlflow_runs

    run = new_run("mnist")
    # No restart inside the task: the Airflow retry is what this checks.
    conf = {"epochs": 3, "seed": 3, "max_restarts": 0}
    prepared = through_xcom(prepare.prepare("mnist", conf, run))
    run_dir = locations.run_dir(run.dag_id, run.run_id)
    outcome: dict[str, object] = {}

    def attempt() -> None:
        try:
            train.train(run, prepared)
        except ChildProcessFailed as failure:
            outcome["error"] = failure
            outcome["failed_at"] = time.monotonic()

    thread = threading.Thread(target=attempt)
    thread.start()
    deadline = time.monotonic() + 300
    while restorable_epoch(run_dir) < 1:
        assert time.monotonic() < deadline and thread.is_alive(), "no first checkpoint"
        time.sleep(0.1)
    (child,) = training_children()
    killed_at = time.monotonic()
    child.kill()
    thread.join(60)
    assert "was killed by SIGKILL" in str(outcome["error"])
    assert float(outcome["failed_at"]) - killed_at < 10  # type: ignore[arg-type]
    assert training_children() == []

    retry = AirflowRun(run.dag_id, run.run_id, try_number=2)
    trained = train.train(retry, prepared)  # the same XCom input as the first try
    assert trained.resumed_from_epoch >= 1
    assert trained.epochs == 3
    history = mlflow_runs.client().get_metric_history(trained.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3]  # each epoch exactly once


@pytest.mark.integration  # prepare's own-code check runs in a child process
def test_a_later_task_uses_the_config_the_run_started_with(tf_runtime, monkeypatch):
    """The cluster a run trains on is chosen once, by prepare, by name: train gets the name through
    XCom and looks its address up in its own deployment's configuration, at the moment it
    connects. A deployment that no longer has that cluster refuses the run (it never trains
    elsewhere); one that has it dials that cluster (here, a closed port)."""
    from stratoflow.config import clusters
    from stratoflow.distributed import cluster
    from stratoflow.tasks import prepare, train

    closed_port = cluster.free_ports(1)[0]
    jobs = {"worker": [f"127.0.0.1:{closed_port}"], "ps": [f"127.0.0.1:{closed_port}"]}
    monkeypatch.delenv(clusters.STANDING_CLUSTER_ENV, raising=False)
    monkeypatch.setenv(clusters.STANDING_CLUSTERS_ENV, json.dumps({"default": jobs}))
    run = new_run("digits")
    prepared = through_xcom(prepare.prepare("digits", {"strategy": "parameter_server"}, run))
    assert prepared.plan.training.cluster == "default"

    monkeypatch.delenv(clusters.STANDING_CLUSTERS_ENV)
    retry = AirflowRun(run.dag_id, run.run_id, try_number=2)
    with pytest.raises(SpecError, match="cluster 'default' is not a cluster of this deployment"):
        train.train(retry, prepared)
    monkeypatch.setenv(clusters.STANDING_CLUSTERS_ENV, json.dumps({"default": jobs}))
    with pytest.raises(cluster.ClusterUnreachableError, match=rf"127\.0\.0\.1:{closed_port}"):
        train.train(retry, prepared)


@pytest.mark.integration
def test_a_failed_run_leaves_nothing_behind(tf_runtime):
    """Training fails for good (no TPU here): no version, no checkpoint, the MLflow run FAILED."""
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import clean_up, prepare, train
    from stratoflow.tracking import mlflow_runs

    run = new_run("digits")
    prepared = through_xcom(prepare.prepare("digits", {"strategy": "tpu"}, run))
    with pytest.raises(ChildProcessFailed, match="needs a TPU"):
        train.train(run, prepared)
    clean_up.clean_up_failed_run("digits", run)

    mlflow_client = mlflow_runs.client()
    mlflow_run = mlflow_client.get_run(prepared.mlflow_run_id)
    assert mlflow_run.info.status == "FAILED"
    assert names.VERSION_TAG not in mlflow_run.data.tags
    versions = mlflow_client.search_model_versions(f"run_id = '{mlflow_run.info.run_id}'")
    assert list(versions) == []
    assert not Path(locations.run_dir(run.dag_id, run.run_id)).exists()


@pytest.mark.integration
def test_clean_up_removes_a_version_registered_by_the_failed_run(tf_runtime, tmp_path, monkeypatch):
    import shutil

    from stratoflow.config.spec import SPECS_DIR
    from stratoflow.tasks import clean_up, evaluate, prepare, register, train
    from stratoflow.tracking import mlflow_runs

    run = new_run("digits")
    prepared = through_xcom(prepare.prepare("digits", {"epochs": 1, "promote": False}, run))
    trained = through_xcom(train.train(run, prepared))
    evaluated = through_xcom(evaluate.evaluate(run, prepared, trained))
    registered = register.log_and_register(run, prepared, trained, evaluated)
    assert registered.promoted is False and registered.aliases == ["challenger"]
    # The pipeline's definition no longer loads when the clean-up comes (a second folder claims
    # its name): the clean-up reads none of it, it finds the run's versions by the run.
    shutil.copytree(SPECS_DIR / "digits", tmp_path / "digits")
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path))
    clean_up.clean_up_failed_run("digits", run)
    mlflow_client = mlflow_runs.client()
    versions = mlflow_client.search_model_versions(f"run_id = '{trained.mlflow_run_id}'")
    assert list(versions) == []
    assert registered.version
    assert mlflow_client.get_run(trained.mlflow_run_id).info.status == "FAILED"


def test_bad_params_fail_before_any_work(tf_runtime):
    from stratoflow.config.parsing import SpecError
    from stratoflow.tasks import prepare

    with pytest.raises(SpecError, match="unknown key 'strategi'; allowed: strategy, replicas"):
        prepare.prepare("digits", {"strategi": "mirrored"}, new_run("digits"))
    with pytest.raises(SpecError, match="batch_size 33 must be divisible by replicas 2"):
        prepare.prepare("digits", {"strategy": "mirrored", "batch_size": 33}, new_run("digits"))


def test_central_storage_with_dropout_is_refused_before_an_mlflow_run_opens(tf_runtime):
    from stratoflow.config.parsing import SpecError
    from stratoflow.tasks import prepare
    from stratoflow.tracking import mlflow_runs

    run = new_run("digits")  # digits' MLP has Dropout
    with pytest.raises(SpecError, match="run conf.strategy 'central_storage' cannot train"):
        prepare.prepare("digits", {"strategy": "central_storage"}, run)
    assert mlflow_runs.find_run(mlflow_runs.client(), "digits", run.dag_id, run.run_id) is None


def test_the_clean_up_of_a_run_refused_at_once_does_not_ask_mlflow(monkeypatch, caplog):
    from stratoflow.tasks import clean_up

    run = new_run("digits")
    (locations.run_dir(run.dag_id, run.run_id) / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv(locations.TRACKING_URI_ENV, "http://127.0.0.1:9")  # nothing listens

    clean_up.clean_up_failed_run("digits", run, tracked=False)
    assert not locations.run_dir(run.dag_id, run.run_id).exists()
    assert "cannot mark the MLflow run" not in caplog.text

    clean_up.clean_up_failed_run("digits", run)  # a tracked run: MLflow is asked, and says so
    assert "cannot mark the MLflow run" in caplog.text


def test_the_clean_up_of_a_failed_run_removes_its_folder_and_no_other():
    from stratoflow.tasks import clean_up

    dag_id = "retrain_digits"
    others = ["manual__2026-12-02T19:02:11+00:00", "manual__2026-12-02T19_02_11_00_00", "a.b", ".a"]
    for run_id in [*others, "."]:
        folder = locations.run_dir(dag_id, run_id) / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ckpt-1.index").write_text(run_id)

    clean_up.clean_up_failed_run("digits", AirflowRun(dag_id, "."))

    assert not locations.run_dir(dag_id, ".").exists()
    for run_id in others:
        checkpoint = locations.run_dir(dag_id, run_id) / "checkpoints" / "ckpt-1.index"
        assert checkpoint.read_text() == run_id


def test_refresh_prepares_the_dataset_and_describes_it_for_the_asset_event(tf_runtime):
    from stratoflow.config.spec import load_spec
    from stratoflow.data import datasets
    from stratoflow.tasks.refresh import RefreshedDataset, refresh_dataset

    result = refresh_dataset("stratoflow_digits")
    assert RefreshedDataset.from_dict(result.to_dict()) == result
    refreshed = result.to_dict()  # the asset event's extra
    reference = datasets.prepare_dataset(load_spec("digits").dataset)
    assert refreshed["dataset"] == "stratoflow_digits"
    assert refreshed["versions"] == {
        "1.0.0": {
            "fingerprint": reference.fingerprint,
            "built": refreshed["versions"]["1.0.0"]["built"],
            "split_sizes": {"train": 1439, "validation": 179, "test": 179},
        }
    }
    with pytest.raises(KeyError, match="stratoflow_digits"):  # names the datasets in use
        refresh_dataset("mnist")
