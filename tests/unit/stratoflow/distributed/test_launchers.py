"""The launchers: one protocol, two implementations, looked up by the run's `launcher` setting;
the local launcher starts exactly the members the strategy's description plans."""

from __future__ import annotations

import ast
import json

import pytest

from stratoflow.config import clusters, locations
from stratoflow.config.connections import ConnectionFields
from stratoflow.config.options import LAUNCHERS
from stratoflow.config.parsing import SpecError
from stratoflow.config.strategies import planned_members
from stratoflow.config.training import TrainingConfig
from stratoflow.distributed.launcher import LocalLauncher, local_members
from stratoflow.distributed.launchers import LAUNCHER_FACTORIES, launcher_for
from stratoflow.distributed.protocol import Launcher
from stratoflow.distributed.ray_launcher import RayLauncher


def test_every_launcher_a_run_may_choose_is_registered():
    assert set(LAUNCHER_FACTORIES) == set(LAUNCHERS)


def test_the_run_setting_picks_the_implementation(monkeypatch):
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"lab": "ray://127.0.0.1:10001"}))
    local = launcher_for(TrainingConfig(launcher="local"))
    ray = launcher_for(TrainingConfig(launcher="ray", ray_cluster="lab", placement="spread"))
    assert isinstance(local, LocalLauncher) and isinstance(local, Launcher)
    assert isinstance(ray, RayLauncher) and isinstance(ray, Launcher)
    # The address is the deployment's, found by the cluster's name.
    assert (ray.address, ray.placement) == ("ray://127.0.0.1:10001", "spread")


def test_no_task_chooses_a_launcher_by_name():
    """`tasks/` asks the registry; an if/else on the launcher's name would bypass it."""
    found = []
    for path in sorted((locations.PROJECT_ROOT / "tasks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Constant) and o.value in LAUNCHERS for o in operands):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_local_members_are_the_planned_members_in_one_cluster():
    plan = planned_members(TrainingConfig(strategy="parameter_server", workers=2, ps=1))
    members = local_members(plan)
    assert [(m.name, m.module, m.server, m.rejoins) for m in members] == [
        (p.name, p.module, p.server, p.rejoins) for p in plan.members
    ]
    configs = [json.loads(m.env["TF_CONFIG"]) for m in members]
    cluster = configs[0]["cluster"]
    assert all(c["cluster"] == cluster for c in configs)
    assert {job: len(addresses) for job, addresses in cluster.items()} == {
        "worker": 2,
        "ps": 1,
        "chief": 1,
    }
    assert [c["task"] for c in configs] == [{"type": p.job, "index": p.index} for p in plan.members]
    # Only this host's workers share its cores; the coordinator and the ps do not.
    assert ["TF_NUM_INTRAOP_THREADS" in m.env for m in members] == [True, True, False, False]


def test_a_lone_training_process_gets_no_cluster():
    (member,) = local_members(planned_members(TrainingConfig(strategy="mirrored")))
    assert (member.name, member.env) == ("training process", {})


def connection_lookup(**by_id: ConnectionFields):
    return lambda conn_id: by_id.get(conn_id)


def test_a_ray_clusters_connection_gives_its_address_and_token(monkeypatch):
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps(["east"]))
    found = connection_lookup(
        stratoflow_ray_east=ConnectionFields(
            conn_id="stratoflow_ray_east", host="ray://127.0.0.1", port=10001, password="tok"
        )
    )
    ray = launcher_for(TrainingConfig(launcher="ray", ray_cluster="east"), found)
    assert isinstance(ray, RayLauncher)
    assert (ray.address, ray.token) == ("ray://127.0.0.1:10001", "tok")


def test_a_connection_overrides_the_environments_address_and_brings_its_own_token(monkeypatch):
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"lab": "127.0.0.1:6379"}))
    without = launcher_for(TrainingConfig(launcher="ray", ray_cluster="lab"))
    assert (without.address, without.token) == ("127.0.0.1:6379", None)  # the node's own token
    found = connection_lookup(
        stratoflow_ray_lab=ConnectionFields(
            conn_id="stratoflow_ray_lab", host="127.0.0.2:6379", password="lab-token"
        )
    )
    target = clusters.ray_target("lab", found)
    assert (target.address, target.token) == ("127.0.0.2:6379", "lab-token")
    assert target.source == "Airflow connection 'stratoflow_ray_lab'"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"host": "ray://127.0.0.1:10001"},
            "Airflow connection 'stratoflow_ray_east': password is empty; expected the Ray "
            "cluster's auth token",
        ),
        (
            {"host": "$(curl x)", "password": "t"},
            "Airflow connection 'stratoflow_ray_east' has address '$(curl x)'",
        ),
    ],
)
def test_a_malformed_ray_connection_is_refused_naming_it(monkeypatch, fields, message):
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps(["east"]))
    found = connection_lookup(
        stratoflow_ray_east=ConnectionFields(conn_id="stratoflow_ray_east", **fields)
    )
    with pytest.raises(clusters.ClusterConfigError) as error:
        clusters.ray_target("east", found)
    assert message in str(error.value)


def test_a_named_cluster_whose_connection_is_missing_is_refused_naming_the_connection(
    monkeypatch,
):
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"east": None}))
    assert clusters.ray_clusters() == {"east": None}
    with pytest.raises(clusters.ClusterConfigError, match="'stratoflow_ray_east', and there is"):
        launcher_for(TrainingConfig(launcher="ray", ray_cluster="east"))
    # A name the deployment does not list is refused before any connection is looked up.
    asked = []
    with pytest.raises(SpecError, match="allowed: east"):
        clusters.ray_target("west", lambda conn_id: asked.append(conn_id))
    assert asked == []
