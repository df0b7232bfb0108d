"""The mnist pipeline through Airflow under the multi-process strategies, into a fresh MLflow
store (no champion yet, so the gate is the spec's minimum accuracy)."""

from __future__ import annotations

import pytest

from pipelines import runner, settings


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    from tasks import tracking

    store = tmp_path_factory.mktemp("mlflow-clusters") / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield tracking.client()


def latest_run(mlflow_client):
    from tasks import tracking

    experiment = mlflow_client.get_experiment_by_name(tracking.experiment_name("mnist"))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1
    )[0]


def test_parameter_server_default_run_passes_the_gate(mlflow_client):
    assert runner.run_pipeline("mnist", {"strategy": "parameter_server"}) == 0
    run = latest_run(mlflow_client)
    assert (run.data.tags["strategy"], run.data.tags["num_workers"]) == ("parameter_server", "2")
    assert run.data.params["training.ps"] == "1"
    assert run.data.metrics["test_accuracy"] >= 0.95
    assert run.data.tags["gate.passed"] == "True"
    steps = sorted(m.step for m in mlflow_client.get_metric_history(run.info.run_id, "loss"))
    assert steps == list(range(1, 9))


@pytest.mark.parametrize(
    ("conf", "workers", "replicas"),
    [
        ({"strategy": "multi_worker_mirrored", "workers": 2, "epochs": 2}, "2", "2"),
        ({"strategy": "central_storage", "replicas": 2, "epochs": 2}, "1", "2"),
    ],
)
def test_synchronous_strategies_run_the_dag(mlflow_client, conf, workers, replicas):
    assert runner.run_pipeline("mnist", conf) == 0
    run = latest_run(mlflow_client)
    assert run.info.status == "FINISHED"
    assert run.data.tags["strategy"] == conf["strategy"]
    assert (run.data.tags["num_workers"], run.data.tags["num_replicas"]) == (workers, replicas)
    assert sorted(m.step for m in mlflow_client.get_metric_history(run.info.run_id, "loss")) == [
        1,
        2,
    ]
    assert run.data.metrics["test_accuracy"] > 0.9
    assert run.data.tags["stratoflow.registered_version"]
