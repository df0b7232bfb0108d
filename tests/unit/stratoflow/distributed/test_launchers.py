"""The launchers: one protocol, two implementations, looked up by the run's `launcher` setting;
the local launcher starts exactly the members the strategy's description plans."""

from __future__ import annotations

import ast
import json

from stratoflow.config import clusters, locations
from stratoflow.config.options import LAUNCHERS
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
