"""The four steps chained as Airflow would chain them, without Airflow: real child training
processes, a real SQLite MLflow store, real signals for the fault tests."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pipelines import settings
from tasks.steps import AirflowRun


def new_run(pipeline: str) -> AirflowRun:
    return AirflowRun(dag_id=f"retrain_{pipeline}", run_id=f"manual__{uuid.uuid4().hex[:12]}")


def training_children() -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if "tasks.training_worker" in " ".join(child.cmdline())
    ]


def test_digits_pipeline_end_to_end(tf_runtime):
    from tasks import steps, tracking

    run = new_run("digits")
    params = {"epochs": 6}
    dataset = steps.prepare("digits", params, run)
    trained = steps.train("digits", params, run, dataset)
    assert trained["mlflow_run_id"] == dataset["mlflow_run_id"]
    evaluated = steps.evaluate("digits", params, run, dataset, trained)
    registered = steps.log_and_register("digits", params, run, dataset, trained, evaluated)

    mlflow_client = tracking.client()
    mlflow_run = mlflow_client.get_run(trained["mlflow_run_id"])
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
    assert evaluated["test_accuracy"] >= 0.9
    assert mlflow_run.data.metrics["test_accuracy"] == pytest.approx(evaluated["test_accuracy"])
    assert "test_recall_class_9" in mlflow_run.data.metrics
    assert mlflow_run.data.tags["num_replicas"] == "1"
    assert registered["version"] == mlflow_run.data.tags[tracking.VERSION_TAG]
    assert "challenger" in registered["aliases"]
    assert not (settings.run_dir(run.dag_id, run.run_id) / "checkpoints").exists()


def test_a_killed_training_process_fails_fast_and_the_retry_resumes(tf_runtime):
    """SIGKILL the training child after its first checkpoint; the retry resumes at epoch 2."""
    from tasks import steps, tracking
    from tasks.launcher import ChildProcessFailed

    run = new_run("mnist")
    params = {"epochs": 3, "seed": 3}
    dataset = steps.prepare("mnist", params, run)
    first_checkpoint = settings.run_dir(run.dag_id, run.run_id) / "checkpoints" / "ckpt-1.index"
    outcome: dict[str, object] = {}

    def attempt() -> None:
        try:
            steps.train("mnist", params, run, dataset)
        except ChildProcessFailed as failure:
            outcome["error"] = failure
            outcome["failed_at"] = time.monotonic()

    thread = threading.Thread(target=attempt)
    thread.start()
    deadline = time.monotonic() + 300
    while not first_checkpoint.exists():
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
    trained = steps.train("mnist", params, retry, dataset)
    assert trained["resumed_from_epoch"] >= 1
    history = tracking.client().get_metric_history(trained["mlflow_run_id"], "loss")
    assert sorted(m.step for m in history) == [1, 2, 3]  # each epoch exactly once


def test_a_failed_run_leaves_nothing_behind(tf_runtime):
    """Training fails for good (no TPU here): no version, no checkpoint, the MLflow run FAILED."""
    from tasks import steps, tracking
    from tasks.launcher import ChildProcessFailed

    run = new_run("digits")
    params = {"strategy": "tpu"}
    dataset = steps.prepare("digits", params, run)
    with pytest.raises(ChildProcessFailed, match="needs a TPU"):
        steps.train("digits", params, run, dataset)
    steps.clean_up_failed_run("digits", run)

    mlflow_client = tracking.client()
    mlflow_run = mlflow_client.get_run(dataset["mlflow_run_id"])
    assert mlflow_run.info.status == "FAILED"
    assert tracking.VERSION_TAG not in mlflow_run.data.tags
    versions = mlflow_client.search_model_versions(f"run_id = '{mlflow_run.info.run_id}'")
    assert list(versions) == []
    assert not Path(settings.run_dir(run.dag_id, run.run_id)).exists()


def test_clean_up_removes_a_version_registered_by_the_failed_run(tf_runtime):
    from tasks import steps, tracking

    run = new_run("digits")
    params = {"epochs": 1, "promote": False}
    dataset = steps.prepare("digits", params, run)
    trained = steps.train("digits", params, run, dataset)
    evaluated = steps.evaluate("digits", params, run, dataset, trained)
    registered = steps.log_and_register("digits", params, run, dataset, trained, evaluated)
    steps.clean_up_failed_run("digits", run)
    mlflow_client = tracking.client()
    versions = mlflow_client.search_model_versions(f"run_id = '{trained['mlflow_run_id']}'")
    assert list(versions) == []
    assert registered["version"]
    assert mlflow_client.get_run(trained["mlflow_run_id"]).info.status == "FAILED"


def test_bad_params_fail_before_any_work(tf_runtime):
    from pipelines.spec import SpecError
    from tasks import steps

    with pytest.raises(SpecError, match="unknown key 'strategi'; allowed: batch_size"):
        steps.prepare("digits", {"strategi": "mirrored"}, new_run("digits"))
    with pytest.raises(SpecError, match="batch_size 33 must be divisible by replicas 2"):
        steps.prepare("digits", {"strategy": "mirrored", "batch_size": 33}, new_run("digits"))


def test_refresh_prepares_the_dataset_and_describes_it_for_the_asset_event(tf_runtime):
    from pipelines.spec import load_spec
    from tasks import datasets, steps

    refreshed = steps.refresh_dataset("stratoflow_digits")
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
        steps.refresh_dataset("mnist")
