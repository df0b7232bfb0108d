"""The mnist pipeline through Airflow under the multi-process strategies, into a fresh MLflow
store (no champion yet, so the gate is the spec's minimum accuracy)."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_mlflow_client
from tests.support.processes import cluster_children, leftovers, run_dag

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-clusters")


def test_parameter_server_default_run_passes_the_gate(mlflow_client):
    run = run_dag(mlflow_client, "mnist", {"strategy": "parameter_server"})
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
def test_synchronous_strategies_run_the_dag(mlflow_client, private_tmpdir, conf, workers, replicas):
    run = run_dag(mlflow_client, "mnist", conf)
    assert run.info.status == "FINISHED"
    assert run.data.tags["strategy"] == conf["strategy"]
    assert (run.data.tags["num_workers"], run.data.tags["num_replicas"]) == (workers, replicas)
    assert sorted(m.step for m in mlflow_client.get_metric_history(run.info.run_id, "loss")) == [
        1,
        2,
    ]
    assert run.data.metrics["test_accuracy"] > 0.9
    assert run.data.tags["stratoflow.registered_version"]
    assert cluster_children() == []
    assert leftovers(private_tmpdir) == []  # workers' scratch and the task's child folder are gone
