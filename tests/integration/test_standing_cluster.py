"""Parameter-server runs against standing servers the test starts with `stratoflow serve` (as
docker-compose or Kubernetes would), and the TF_CONFIG contract of the entrypoints.

A run used the standing servers when the topology its chief recorded (`environment.json`) names
their addresses and the only training process it started was its coordinator: no local worker
or ps (`tests.support.processes.ChildWatcher` sees every process the run started, grandchildren
too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stratoflow.config import clusters, names
from stratoflow.distributed import cluster
from stratoflow.distributed.protocol import READY_MARKER
from stratoflow.tasks.run_context import AirflowRun
from tests.conftest import fresh_mlflow_client
from tests.support.processes import (
    SERVER_MODULE,
    TRAINING_MODULE,
    ChildWatcher,
    cluster_children,
    run_dag,
)

pytestmark = pytest.mark.integration

STRATOFLOW = str(Path(sys.executable).parent / "stratoflow")


def start_server(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [STRATOFLOW, "serve", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(server: subprocess.Popen[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    assert server.stdout is not None
    for line in server.stdout:
        if line.strip() == READY_MARKER:
            return
        assert time.monotonic() < deadline, "server did not come up"
    raise AssertionError(f"server exited with {server.wait()}")


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-standing-cluster")


@pytest.fixture(scope="module")
def standing_cluster():
    """Two workers and a ps serving for the whole module, shared by its runs."""
    worker_0, worker_1, ps_0 = (f"{cluster.LOOPBACK}:{port}" for port in cluster.free_ports(3))
    layout = cluster.ClusterLayout({"worker": [worker_0, worker_1], "ps": [ps_0]})
    jobs = json.dumps(layout.jobs)
    servers = [
        # Two servers told by flags, one by TF_CONFIG alone (the Kubeflow TFJob contract).
        start_server(["--job", "worker", "--index", "0", "--cluster", jobs], {}),
        start_server(["--job", "worker", "--index", "1", "--cluster", jobs], {}),
        start_server([], {"TF_CONFIG": layout.tf_config("ps", 0)}),
    ]
    try:
        for server in servers:
            wait_ready(server)
        yield layout, servers
    finally:
        for server in servers:
            server.kill()
            server.wait()


def assert_ran_on(
    layout: cluster.ClusterLayout, mlflow_client, run_id: str, watcher: ChildWatcher
) -> None:
    """The run recorded the standing servers as its cluster and started only a coordinator."""

    environment = mlflow_client.download_artifacts(run_id, names.ENVIRONMENT_ARTIFACT)
    recorded = json.loads(Path(environment).read_text())["cluster"]
    jobs = recorded["jobs"]
    assert {job: jobs[job] for job in ("worker", "ps")} == layout.jobs
    assert sorted(jobs) == ["chief", "ps", "worker"]
    assert recorded["task"] == {"type": "chief", "index": 0}
    assert (recorded["workers"], recorded["ps"]) == (2, 1)
    training = watcher.children(TRAINING_MODULE)
    assert [child.tf_config["task"] for child in training if child.tf_config] == [
        {"type": "chief", "index": 0}
    ]
    assert len(training) == 1
    assert watcher.children(SERVER_MODULE) == []  # no local worker or ps
    assert cluster_children() == []  # and the coordinator is gone


def test_parameter_server_training_uses_the_standing_servers(
    tf_runtime, standing_cluster, mlflow_client, child_watcher, monkeypatch
):
    from stratoflow.tasks import prepare, train

    layout, servers = standing_cluster
    # The deployment names its clusters; the run picks one by name.
    monkeypatch.setenv(clusters.STANDING_CLUSTERS_ENV, json.dumps({"rack-1": layout.jobs}))
    run = AirflowRun("retrain_digits", f"manual__{uuid.uuid4().hex[:12]}")
    params = {"strategy": "parameter_server", "cluster": "rack-1", "epochs": 3}
    trained = train.train(run, prepare.prepare("digits", params, run))

    assert trained.num_workers == 2
    history = mlflow_client.get_metric_history(trained.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert_ran_on(layout, mlflow_client, trained.mlflow_run_id, child_watcher)
    assert all(server.poll() is None for server in servers)  # standing: still serving


def test_a_dag_run_without_a_cluster_uses_stratoflow_cluster(
    standing_cluster, mlflow_client, child_watcher, monkeypatch
):
    """`cluster` empty, `$STRATOFLOW_CLUSTER` set where the tasks run: a real DAG run uses it,
    as the deployment's cluster `default`."""
    layout, servers = standing_cluster
    monkeypatch.setenv(clusters.STANDING_CLUSTER_ENV, json.dumps(layout.jobs))
    run = run_dag(mlflow_client, "digits", {"strategy": "parameter_server", "epochs": 2})

    assert run.data.tags["strategy"] == "parameter_server"
    assert_ran_on(layout, mlflow_client, run.info.run_id, child_watcher)
    assert run.data.params["training.cluster"] == "default"  # the resolved config: a name
    assert all(server.poll() is None for server in servers)


def test_an_unreachable_standing_server_fails_in_seconds_naming_it(tf_runtime, monkeypatch):
    from stratoflow.tasks import prepare, train

    closed_port = cluster.free_ports(1)[0]
    jobs = {"worker": [f"127.0.0.1:{closed_port}"], "ps": [f"127.0.0.1:{closed_port}"]}
    monkeypatch.setenv(clusters.STANDING_CLUSTERS_ENV, json.dumps({"gone": jobs}))
    run = AirflowRun("retrain_digits", f"manual__{uuid.uuid4().hex[:12]}")
    params = {"strategy": "parameter_server", "cluster": "gone"}
    prepared = prepare.prepare("digits", params, run)
    started = time.monotonic()
    with pytest.raises(cluster.ClusterUnreachableError, match=r"worker 0 at 127\.0\.0\.1:\d+"):
        train.train(run, prepared)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("tf_config", "chief"),
    [
        (None, True),
        ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}, True),
        ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}, False),
        (
            {
                "cluster": {"chief": ["c:1"], "worker": ["a:1"]},
                "task": {"type": "worker", "index": 0},
            },
            False,
        ),
        (
            {
                "cluster": {"chief": ["c:1"], "worker": ["a:1"]},
                "task": {"type": "chief", "index": 0},
            },
            True,
        ),
    ],
)
def test_the_training_entrypoint_finds_its_role_in_tf_config(monkeypatch, tf_config, chief):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert cluster.this_process_is_chief() is chief


def test_serve_refuses_a_task_outside_its_cluster():
    jobs = json.dumps({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]})
    result = subprocess.run(
        [STRATOFLOW, "serve", "--job", "ps", "--index", "3", "--cluster", jobs],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "task ps:3 is not in the cluster" in result.stderr
