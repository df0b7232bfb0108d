"""When `ray_launcher.connect` tries a second time, and when it gives up at once; the thread
settings the members get from the nodes they were placed on.

The failure the retry is for, Ray's client proxier losing the server process it starts for a
driver (seen once in CI, a race inside Ray), cannot be provoked on purpose, so `ray.init` is
replaced here by one that fails as told: a test double for Ray's side only. The real connections
(through Ray Client and to the GCS, token refused) are in tests/integration/test_ray_hosts.py,
and so is a real run's member reporting its threads and nice level.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest
import ray

from stratoflow.config.strategies import planned_members
from stratoflow.config.training import TrainingConfig
from stratoflow.distributed import ray_launcher
from stratoflow.distributed.launcher import Member, local_members
from stratoflow.distributed.protocol import Restarts


class FailingInit:
    """Stands in for `ray.init`: raises the given errors in turn, then connects."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.addresses: list[str] = []

    def __call__(self, address: str, **_: object) -> None:
        self.addresses.append(address)
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture
def init(monkeypatch: pytest.MonkeyPatch):
    def use(*errors: Exception) -> FailingInit:
        fake = FailingInit(*errors)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray_launcher, "RAY_CLIENT_RETRY_PAUSE_SECONDS", 0.0)
        return fake

    return use


def test_a_ray_client_server_lost_at_start_up_is_tried_once_more(init, caplog):
    fake = init(ConnectionError("Failed during this or a previous request"))
    with caplog.at_level(logging.WARNING, logger=ray_launcher.__name__):
        ray_launcher.connect("ray://head:10001")
    assert fake.addresses == ["ray://head:10001"] * 2
    assert "trying again" in caplog.text


def test_a_second_failure_names_the_address_and_the_error(init):
    fake = init(ConnectionError("first"), ConnectionError("second"))
    with pytest.raises(ray_launcher.RayClusterError, match=r"'ray://head:10001'.*second"):
        ray_launcher.connect("ray://head:10001")
    assert len(fake.addresses) == 2


def test_nothing_answering_is_not_waited_for_twice(init):
    fake = init(ConnectionError("ray client connection timeout"))
    with pytest.raises(ray_launcher.RayClusterError, match="connection timeout"):
        ray_launcher.connect("ray://head:10001")
    assert len(fake.addresses) == 1


def test_a_gcs_address_gets_one_attempt(init):
    fake = init(ConnectionError("refused"))
    with pytest.raises(ray_launcher.RayClusterError, match="'head:6379'"):
        ray_launcher.connect("head:6379")
    assert len(fake.addresses) == 1


THREADS = "TF_NUM_INTRAOP_THREADS"


def node(machine: str, ip: str, cpus: int, sets_threads: bool = False) -> dict[str, Any]:
    """What `MemberHost.node` reports."""
    return {
        "ip": ip,
        "hostname": machine,
        "node_id": ip,
        "machine": machine,
        "port": 4000,
        "cpus": cpus,
        "sets_threads": sets_threads,
    }


def ray_members(config: TrainingConfig, nodes: list[dict[str, Any]]) -> list[Member]:
    plan = planned_members(config)
    gangs = ray_launcher._Gangs(len(plan.members), "pack")
    cluster = ray_launcher._RayCluster(
        plan.members, plan.result_from, "{}", gangs, Restarts(0), None
    )
    return cluster._members(nodes)


def threads(members: list[Member]) -> list[str | None]:
    return [member.env.get(THREADS) for member in members]


@pytest.fixture
def no_thread_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS, raising=False)


def test_workers_placed_on_one_machine_share_its_cores_as_local_workers_do(no_thread_setting):
    # Two Ray nodes of one machine (as containers or network namespaces on one kernel): the
    # members must not each take every core, or they preempt each other at every collective.
    config = TrainingConfig(strategy="parameter_server", workers=2, ps=1)
    cpus = os.cpu_count() or 1
    nodes = [node("m", f"10.0.0.{n}", cpus) for n in (1, 2, 1, 2)]
    placed = ray_members(config, nodes)
    assert [m.name for m in placed] == ["worker 0", "worker 1", "ps 0", "coordinator"]
    assert threads(placed) == threads(local_members(planned_members(config)))
    assert threads(placed) == [str(max(1, cpus // 2))] * 2 + [None, None]


def test_a_worker_alone_on_its_machine_gets_all_its_cores(no_thread_setting):
    config = TrainingConfig(strategy="multi_worker_mirrored", workers=3)
    nodes = [node("a", "10.0.0.1", 8), node("b", "10.0.0.2", 8), node("b", "10.0.0.3", 8)]
    assert threads(ray_members(config, nodes)) == ["8", "4", "4"]


def test_a_thread_setting_of_the_driver_or_the_node_wins(monkeypatch: pytest.MonkeyPatch):
    config = TrainingConfig(strategy="multi_worker_mirrored", workers=2)
    monkeypatch.delenv(THREADS, raising=False)
    nodes = [node("a", "10.0.0.1", 8, sets_threads=True), node("b", "10.0.0.2", 8)]
    assert threads(ray_members(config, nodes)) == [None, "8"]  # the node's own value applies
    monkeypatch.setenv(THREADS, "3")  # forwarded to every member
    assert threads(ray_members(config, nodes)) == ["3", "3"]


def test_members_start_at_the_nice_level_of_the_driver():
    # Ray would start them at 15; the local launcher's members inherit the task's level.
    done = subprocess.run(
        [sys.executable, "-c", f"import {ray_launcher.__name__} as r; print(r.member_niceness())"],
        preexec_fn=lambda: os.nice(5),
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(done.stdout) == os.getpriority(os.PRIO_PROCESS, 0) + 5


def test_members_on_the_node_of_a_lost_member_are_lost_with_it():
    """Ray reports one lost actor at a time: its node's other members go with it (the gang's
    repair replaces them all at once), and nothing there is asked to stop."""
    lost_nodes: set[str] = set()

    def running(name: str, node_id: str, lost: str | None = None) -> ray_launcher._ActorRunning:
        # The supervision's view of a started member, without starting one on Ray.
        member = object.__new__(ray_launcher._ActorRunning)
        member.member = Member(name, "m")
        member.node = node(node_id, node_id, 4)
        member.lost, member.lost_nodes = lost, lost_nodes
        if lost:
            lost_nodes.add(node_id)
        return member

    members = [
        running("worker 0", "10.0.0.2"),
        running("worker 1", "10.0.0.3", lost="was lost with its node 10.0.0.3"),
        running("ps 0", "10.0.0.3"),
        running("coordinator", "10.0.0.2"),
    ]
    assert ray_launcher.lost_with_their_nodes(members) == [1, 2]
    assert "lost with another member" in (members[2].on_lost_node() or "")
    assert members[0].on_lost_node() is None


def test_only_an_actor_ray_could_not_reach_marks_its_node_as_not_answering():
    """New actors avoid such a node; an actor Ray saw die (its process killed, say) leaves its
    node usable."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

    refused = ActorUnavailableError("failed to connect: Connection refused", b"1" * 16)
    assert ray_launcher.node_stopped_answering(refused)
    assert ray_launcher.node_stopped_answering(GetTimeoutError())
    assert not ray_launcher.node_stopped_answering(ActorDiedError())
