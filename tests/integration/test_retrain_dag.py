"""Whole DAG runs through Airflow (`airflow dags test`, as `make run` does) into a fresh MLflow
store: the default mnist run, a worse run that must not take the champion alias, a failing run
that must leave nothing behind, and `stratoflow compare` over what they produced."""

from __future__ import annotations

import json

import pytest

from pipelines import cli, runner, settings


@pytest.fixture(scope="module")
def fresh_tracking_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield


@pytest.fixture(scope="module")
def mlflow_client(fresh_tracking_store):
    from tasks import tracking

    return tracking.client()


def mlflow_runs(mlflow_client, pipeline: str):
    from tasks import tracking

    experiment = mlflow_client.get_experiment_by_name(tracking.experiment_name(pipeline))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time ASC"]
    )


def metric_steps(mlflow_client, run_id: str, key: str) -> list[int]:
    return sorted(metric.step for metric in mlflow_client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def default_mnist_run(mlflow_client, capsys_module):
    code = runner.run_pipeline("mnist", {})
    return code, capsys_module()


@pytest.fixture(scope="module")
def capsys_module():
    """What the runner printed (it writes its summary to stdout), captured per module."""
    import io
    import sys

    buffer = io.StringIO()
    original = sys.stdout
    sys.stdout = buffer
    yield buffer.getvalue
    sys.stdout = original


def test_default_mnist_run_trains_evaluates_and_registers_a_champion(
    default_mnist_run, mlflow_client
):
    from tasks import registry

    code, printed = default_mnist_run
    assert code == 0
    (run,) = mlflow_runs(mlflow_client, "mnist")
    assert run.info.status == "FINISHED"
    assert run.data.tags["airflow.dag_id"] == "retrain_mnist"
    assert run.data.tags["airflow.run_id"].startswith("manual__")
    assert run.data.tags["strategy"] == "one_device"
    assert run.data.tags["loop"] == "custom"
    assert run.data.tags["num_replicas"] == "1"
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second"):
        assert metric_steps(mlflow_client, run.info.run_id, key) == list(range(1, 9)), key
    assert run.data.metrics["test_accuracy"] >= 0.95
    assert run.data.params["training.epochs"] == "8"
    assert registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "1",
    }
    assert "DAG run manual__" in printed and "succeeded" in printed
    assert "version 1 (aliases: challenger, champion)" in printed
    assert "mlflow ui --backend-store-uri" in printed


def test_a_worse_run_gets_challenger_but_leaves_champion(default_mnist_run, mlflow_client):
    from tasks import registry

    assert default_mnist_run[0] == 0
    conf = {"strategy": "mirrored", "replicas": 2, "epochs": 1, "learning_rate": 1e-5}
    assert runner.run_pipeline("mnist", conf) == 0
    latest = mlflow_runs(mlflow_client, "mnist")[-1]
    assert latest.data.tags["strategy"] == "mirrored"
    assert latest.data.tags["num_replicas"] == "2"
    assert latest.data.tags["gate.passed"] == "False"
    assert metric_steps(mlflow_client, latest.info.run_id, "loss") == [1]
    assert registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "2",
    }


def test_compare_lists_both_runs_and_marks_the_champion(default_mnist_run, mlflow_client, capsys):
    assert cli.main(["compare", "mnist", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["strategy"] for row in rows] == ["mirrored", "one_device"]  # newest first
    assert [row["champion"] for row in rows] == [False, True]
    assert rows[1]["test_accuracy"] >= 0.95
    assert all(row["examples_per_second"] > 0 and row["duration_s"] > 0 for row in rows)
    assert cli.main(["compare", "mnist"]) == 0
    table = capsys.readouterr().out
    assert "mirrored" in table and cli.CHAMPION_MARKER in table


def test_a_run_that_fails_for_good_leaves_nothing_behind(mlflow_client):
    """No TPU here: both tries of train_model fail, and the failure callback cleans up."""
    assert runner.run_pipeline("digits", {"strategy": "tpu"}) == 1
    (run,) = mlflow_runs(mlflow_client, "digits")
    assert run.info.status == "FAILED"
    assert run.data.tags["airflow.try_number"] == "2"  # the retry reused the DAG run's MLflow run
    assert list(mlflow_client.search_model_versions("name = 'stratoflow-digits'")) == []
    dag_run_dir = settings.run_dir("retrain_digits", run.data.tags["airflow.run_id"])
    assert not dag_run_dir.exists()
