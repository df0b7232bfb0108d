"""The mnist pipeline through Airflow with launcher `ray`, its members on several hosts.

The hosts are Linux network namespaces with a Ray node each (`tests/support/ray_hosts.py`), one Ray
cluster for the whole module. The Airflow process (`airflow dags test`, as `make run`) runs on
the head host, which is a Ray node without CPUs: the members go to the worker hosts. Then a
parameter-server worker killed mid-run (training goes on, the worker rejoins from the spare its
actor keeps), a multi-worker-mirrored worker killed (the cluster restarts in the same actors,
from their spares), a worker host killed mid-run (the cluster restarts from its checkpoint on
the host left, the other host's actor and spare kept), a host cut off (the task fails
within a bound, naming the unreachable member), and new actors for a lost host's members
placed off it. Nothing may be left running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stratoflow.cli import runner
from stratoflow.config import clusters, locations, names
from stratoflow.services.airflow_setup import airflow_command
from tests.conftest import fresh_mlflow_client
from tests.support.processes import run_dag
from tests.support.ray_hosts import (
    CLIENT,
    CLIENT_PORT,
    HEAD,
    SUBNET,
    RayHosts,
    leftover_namespaces,
    ray_hosts,
)

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

TRAINING_MODULE = "stratoflow.training.worker"
SERVER_MODULE = "stratoflow.distributed.server"
SPARE_MODULE = "stratoflow.distributed.spares"
# A killed or cut-off member must be recovered from, or reported, within these bounds.
RECOVERY_BOUND_SECONDS = 150
FAILURE_BOUND_SECONDS = 90


@pytest.fixture(scope="module")
def hosts() -> Iterator[RayHosts]:
    with ray_hosts(workers=2) as made:
        yield made
    assert leftover_namespaces() == []


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-ray")


@pytest.fixture
def on_head(hosts: RayHosts, monkeypatch: pytest.MonkeyPatch) -> RayHosts:
    """`make run`'s runner starts `airflow dags test` on the head host, with the Ray token."""
    monkeypatch.setattr(
        runner, "airflow_command", lambda *args: hosts.in_host(HEAD, airflow_command(*args))
    )
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(name, hosts.env()[name])
    monkeypatch.setenv(clusters.RAY_ADDRESS_ENV, hosts.ray_address)
    return hosts


@pytest.fixture
def on_head_through_a_connection(on_head: RayHosts, monkeypatch: pytest.MonkeyPatch) -> RayHosts:
    """As `on_head`, but the cluster's address and token are in the Airflow Connection
    `stratoflow_ray_default` alone: the environment names the cluster, not where it is, and the
    head host's token file is out of reach."""
    monkeypatch.delenv(clusters.RAY_ADDRESS_ENV)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps([clusters.DEFAULT]))
    monkeypatch.setenv(
        "AIRFLOW_CONN_STRATOFLOW_RAY_DEFAULT",
        json.dumps(
            {
                "conn_type": "stratoflow_ray",
                "host": on_head.ray_address,
                "password": on_head.token_path.read_text().strip(),
            }
        ),
    )
    return on_head


def members_running(hosts: RayHosts) -> list[psutil.Process]:
    """Training and server processes on the hosts (members run under Ray, not under pytest)."""
    found = []
    for pid in (pid for host in hosts.hosts for pid in hosts.pids(host)):
        try:
            process = psutil.Process(pid)
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if TRAINING_MODULE in command or SERVER_MODULE in command:
            found.append(process)
    return found


def member(hosts: RayHosts, job: str, index: int) -> psutil.Process | None:
    for process in members_running(hosts):
        try:
            task = json.loads(process.environ().get("TF_CONFIG") or "{}").get("task")
        except psutil.Error:
            continue
        if task == {"type": job, "index": index}:
            return process
    return None


def host_of(hosts: RayHosts, pid: int) -> str:
    for host in hosts.worker_hosts:
        if pid in hosts.pids(host):
            return host
    raise AssertionError(f"pid {pid} runs on none of {hosts.worker_hosts}")


def first_checkpoint_after(started: float) -> Callable[[], bool]:
    runs = locations.state_dir() / "runs"

    def written() -> bool:
        return any(
            path.stat().st_mtime > started for path in runs.glob("*/*/checkpoints/ckpt-1.index")
        )

    return written


def run_dag_meanwhile(
    mlflow_client: Any, conf: dict[str, Any], when: Callable[[], bool], act: Callable[[], Any]
) -> tuple[Any, Any, float]:
    """Run the mnist DAG; once `when()` holds, call `act()`. The MLflow run, what `act`
    returned and the time it acted."""
    outcome: dict[str, Any] = {}

    def go() -> None:
        try:
            outcome["run"] = run_dag(mlflow_client, "mnist", conf)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=go)
    thread.start()
    deadline = time.monotonic() + 600
    while not when():
        assert thread.is_alive(), f"the run ended before the moment came: {outcome}"
        assert time.monotonic() < deadline, "the moment never came"
        time.sleep(0.2)
    acted = act()
    acted_at = time.time()
    thread.join(900)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    return outcome["run"], acted, acted_at


def steps(mlflow_client: Any, run: Any, key: str = "loss") -> list[int]:
    return sorted(m.step for m in mlflow_client.get_metric_history(run.info.run_id, key))


def environment_of(mlflow_client: Any, run: Any, tmp_path: Path) -> dict[str, Any]:
    path = mlflow_client.download_artifacts(run.info.run_id, names.ENVIRONMENT_ARTIFACT, tmp_path)
    return json.loads(Path(path).read_text())


def test_multi_worker_mirrored_trains_with_one_worker_per_host(
    on_head_through_a_connection, mlflow_client, tmp_path
):
    hosts: RayHosts = on_head_through_a_connection
    conf = {
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "launcher": "ray",
        "placement": "strict_spread",
        "epochs": 2,
    }
    run = run_dag(mlflow_client, "mnist", conf)
    tags = run.data.tags
    assert (tags["launcher"], tags["num_workers"]) == ("ray", "2")
    nodes = {tags["node.worker_0"], tags["node.worker_1"]}
    assert len(nodes) == 2, nodes  # strict_spread: one worker per host
    assert all(node.startswith(f"{SUBNET}.") for node in nodes)
    assert steps(mlflow_client, run) == [1, 2]
    assert run.data.metrics["restarts"] == 0
    assert run.data.metrics["test_accuracy"] > 0.8
    environment = environment_of(mlflow_client, run, tmp_path)
    # Worker 0 ran as a local worker would: at the nice level of the task that drove it (Ray
    # starts its workers at 15) and with its share of the cores (the hosts are one machine).
    assert environment["host"]["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert environment["host"]["intra_op_threads"] == max(1, (os.cpu_count() or 1) // 2)
    cluster = environment["cluster"]
    # The members talked over the hosts' addresses, each worker on its own host.
    workers = cluster["jobs"]["worker"]
    assert len({address.split(":")[0] for address in workers}) == 2
    assert all(address.startswith(f"{SUBNET}.") for address in workers)
    assert set(cluster["nodes"].values()) == nodes
    assert members_running(hosts) == []


def spare_beside(process: psutil.Process) -> psutil.Process | None:
    """The warm spare its actor keeps (`warm_spares`), if it has started one."""
    for sibling in process.parent().children():
        if SPARE_MODULE in " ".join(sibling.cmdline()):
            return sibling
    return None


def serving(process: psutil.Process) -> bool:
    """Whether `process` listens on a TCP port (a member's TensorFlow server). Read from its own
    /proc entry: psutil's connections are those of this process's network namespace."""
    proc = Path(f"/proc/{process.pid}")
    sockets = set()
    try:
        for fd in list((proc / "fd").iterdir()):
            with contextlib.suppress(OSError):  # closed since it was listed
                if (target := os.readlink(fd)).startswith("socket:["):
                    sockets.add(target[len("socket:[") : -1])
        tables = [(proc / "net" / name).read_text() for name in ("tcp", "tcp6")]
    except OSError:  # the process is gone
        return False
    listening_state = "0A"
    return any(
        fields[3] == listening_state and fields[9] in sockets
        for table in tables
        for fields in (line.split() for line in table.splitlines()[1:])
    )


def wait_for(condition: Callable[[], Any], what: str, seconds: float = RECOVERY_BOUND_SECONDS):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return found


def test_a_killed_parameter_server_worker_rejoins_from_its_spare(on_head, mlflow_client):
    """With warm spares, worker 1's actor keeps a spare: it becomes worker 1 when the worker is
    killed, while training goes on."""
    hosts: RayHosts = on_head
    conf = {
        "strategy": "parameter_server",
        "workers": 2,
        "ps": 1,
        "launcher": "ray",
        "placement": "spread",
        "warm_spares": True,
        "epochs": 5,
    }

    def kill_worker_1() -> tuple[int, int, int]:
        """Kill worker 1 once its spare runs; the spare must then serve, and the coordinator be
        the same process (a cluster restart would have replaced it)."""
        victim, coordinator = member(hosts, "worker", 1), member(hosts, "chief", 0)
        assert victim is not None and coordinator is not None
        spare = wait_for(lambda: spare_beside(victim), "worker 1's actor kept no spare")
        assert not serving(spare)
        victim.kill()
        wait_for(lambda: serving(spare), "the spare did not take worker 1's place")
        still = member(hosts, "chief", 0)
        return victim.pid, coordinator.pid, still.pid if still else 0

    run, (victim_pid, coordinator_pid, coordinator_after), killed_at = run_dag_meanwhile(
        mlflow_client, conf, first_checkpoint_after(time.time()), kill_worker_1
    )
    assert coordinator_after == coordinator_pid  # training went on: no cluster restart
    tags = run.data.tags
    assert tags["launcher"] == "ray"
    placed = [tags[f"node.{name}"] for name in ("worker_0", "worker_1", "ps_0", "coordinator")]
    assert all(node.startswith(f"{SUBNET}.") for node in placed), placed
    assert len(set(placed)) == 2, placed  # spread over both worker hosts
    assert run.data.metrics["restarts"] == 1
    (recovery,) = mlflow_client.get_metric_history(run.info.run_id, "recovery_seconds")
    assert 0 < recovery.value < RECOVERY_BOUND_SECONDS
    # Each epoch reached MLflow exactly once, and the run was not restarted from a checkpoint.
    assert steps(mlflow_client, run) == [1, 2, 3, 4, 5]
    assert run.data.metrics["test_accuracy"] > 0.8
    assert not psutil.pid_exists(victim_pid)
    assert members_running(hosts) == []  # the spares left unused too
    log.info("parameter_server worker killed: rejoined after %.1f s", recovery.value)


# Two workers on two hosts, each actor keeping a spare.
MWM_WITH_SPARES = {
    "strategy": "multi_worker_mirrored",
    "workers": 2,
    "launcher": "ray",
    "placement": "spread",
    "warm_spares": True,
    "epochs": 3,
}


def recovered_once(mlflow_client: Any, run: Any) -> Any:
    """Asserts a run of `MWM_WITH_SPARES` recovered once, resumed from its checkpoint: each
    epoch logged once, the accuracy in its band. Its recovery_seconds metric."""
    assert run.data.metrics["restarts"] == 1
    (recovery,) = mlflow_client.get_metric_history(run.info.run_id, "recovery_seconds")
    assert 0 < recovery.value < RECOVERY_BOUND_SECONDS
    assert steps(mlflow_client, run) == [1, 2, 3]
    assert run.data.metrics["test_accuracy"] > 0.8
    return recovery


def test_a_killed_multi_worker_mirrored_worker_restarts_in_the_same_actors(on_head, mlflow_client):
    """A killed worker (its node alive) restarts the cluster in the gang it had: no new
    reservation, each member started again from the spare its actor keeps."""
    hosts: RayHosts = on_head

    def kill_worker_1() -> list[int]:
        workers = [member(hosts, "worker", index) for index in (0, 1)]
        assert None not in workers
        spares = [wait_for(lambda w=w: spare_beside(w), "an actor kept no spare") for w in workers]
        workers[1].kill()
        wait_for(lambda: all(serving(spare) for spare in spares), "the spares did not take over")
        return [spare.pid for spare in spares]

    run, spare_pids, _ = run_dag_meanwhile(
        mlflow_client, MWM_WITH_SPARES, first_checkpoint_after(time.time()), kill_worker_1
    )
    recovery = recovered_once(mlflow_client, run)
    assert not any(psutil.pid_exists(pid) for pid in spare_pids)
    assert members_running(hosts) == []
    log.info("multi_worker_mirrored worker killed: training again after %.1f s", recovery.value)


def test_a_killed_worker_host_restarts_the_cluster_from_its_checkpoint(on_head, mlflow_client):
    """The other host's actor stays, its spare taking worker 0 over; a new actor takes worker 1's
    place on the host left."""
    hosts: RayHosts = on_head

    def kill_host_of_worker_1() -> tuple[str, int]:
        survivor, victim = member(hosts, "worker", 0), member(hosts, "worker", 1)
        assert survivor is not None and victim is not None
        host = host_of(hosts, victim.pid)
        assert host_of(hosts, survivor.pid) != host  # spread
        spare = wait_for(lambda: spare_beside(survivor), "worker 0's actor kept no spare")
        hosts.kill_host(host)
        wait_for(lambda: serving(spare), "worker 0's spare did not take over")
        return host, spare.pid

    try:
        run, (killed_host, spare_pid), _ = run_dag_meanwhile(
            mlflow_client,
            MWM_WITH_SPARES,
            first_checkpoint_after(time.time()),
            kill_host_of_worker_1,
        )
    finally:
        for host in hosts.worker_hosts:  # the next test needs both hosts again
            if not [pid for pid in hosts.pids(host)]:
                hosts.start_node(host)
    tags = run.data.tags
    killed_address = f"{hosts.address_of(killed_host)} "
    # After the restart both workers ran on the host that was left.
    assert not tags["node.worker_0"].startswith(killed_address)
    assert tags["node.worker_0"] == tags["node.worker_1"]
    recovery = recovered_once(mlflow_client, run)
    assert not psutil.pid_exists(spare_pid)
    assert members_running(hosts) == []
    log.info("worker host killed: training again after %.1f s", recovery.value)


CUT_OFF_PROGRAM = """
import json, sys, time, uuid
from stratoflow.distributed.launcher import ChildProcessFailed
from stratoflow.tasks import prepare, train
from stratoflow.tasks.run_context import AirflowRun
run = AirflowRun(dag_id="retrain_mnist", run_id=f"manual__{uuid.uuid4().hex[:12]}")
prepared = prepare.prepare("mnist", json.loads(sys.argv[1]), run)
try:
    train.train(run, prepared)
    outcome = {"error": None}
except ChildProcessFailed as error:
    outcome = {"error": str(error), "type": type(error).__name__, "at": time.time()}
open(sys.argv[2], "w").write(json.dumps(outcome))
"""


def test_a_host_cut_off_fails_the_task_naming_the_unreachable_member(on_head, tmp_path):
    """The task body on the head host (as Airflow runs it), no restart allowed: a bounded
    failure that names the member whose host is unreachable."""
    hosts: RayHosts = on_head
    conf = {
        "strategy": "multi_worker_mirrored",
        "workers": 2,
        "launcher": "ray",
        "placement": "strict_spread",
        "epochs": 4,
        "max_restarts": 0,
    }
    outcome_path = tmp_path / "outcome.json"
    env = {**hosts.env(), clusters.RAY_ADDRESS_ENV: hosts.ray_address}
    program = subprocess.Popen(
        hosts.in_host(
            HEAD,
            [sys.executable, "-c", CUT_OFF_PROGRAM, json.dumps(conf), str(outcome_path)],
        ),
        env=env,
    )
    cut_host = None
    try:
        when = first_checkpoint_after(time.time())
        deadline = time.monotonic() + 600
        while not when():
            assert program.poll() is None, "the training ended before the cut"
            assert time.monotonic() < deadline
            time.sleep(0.2)
        victim = member(hosts, "worker", 1)
        assert victim is not None
        cut_host = host_of(hosts, victim.pid)
        hosts.cut_off(cut_host)
        cut_at = time.time()
        program.wait(timeout=FAILURE_BOUND_SECONDS + 60)
    finally:
        if program.poll() is None:
            program.kill()
        if cut_host:
            hosts.reconnect(cut_host)
    outcome = json.loads(outcome_path.read_text())
    assert outcome["error"], "training succeeded although a host was cut off"
    assert outcome["at"] - cut_at < FAILURE_BOUND_SECONDS
    address = hosts.address_of(cut_host)
    assert "worker 1" in outcome["error"] and address in outcome["error"], outcome["error"]
    assert "unreachable" in outcome["error"] or "lost" in outcome["error"], outcome["error"]
    log.info(
        "host cut off: task failed %.1f s later: %s", outcome["at"] - cut_at, outcome["error"][:300]
    )


def program_result(hosts: RayHosts, host: str, program: str, argument: str) -> tuple[Any, str]:
    """Run Python `program ARGUMENT` on `host`; what it printed after "RESULT " (JSON), and its
    standard error."""
    done = subprocess.run(
        hosts.in_host(host, [sys.executable, "-c", program, argument]),
        env=hosts.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), done.stderr


REPAIR_PROGRAM = """
import json, sys, time
import ray
from stratoflow.distributed import ray_launcher
ray_launcher.connect(sys.argv[1])
deadline = time.monotonic() + 120  # an earlier test's actors and reservations may still go
while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
    assert time.monotonic() < deadline, ray.available_resources()
    time.sleep(0.5)
gang = ray_launcher._Gang(4, "spread")
try:
    before = [node["node_id"] for node in gang.nodes()]
    silent = before[0]
    lost = [index for index, node in enumerate(before) if node == silent]
    gang.lose(lost, unreachable=[silent])
    gang.repair()
    after = [node["node_id"] for node in gang.nodes()]
finally:
    gang.close()
print("RESULT", json.dumps({"before": before, "silent": silent, "lost": lost, "after": after}))
"""


def test_new_actors_for_lost_ones_avoid_the_node_that_stopped_answering(hosts):
    """A host's actors lost: Ray still counts the dead node as live for some 15 s and would try
    to place half the new actors there (placement `spread`); they all go to the other host, and
    the actors kept stay where they were. (Here the "silent" node is alive, so a new actor placed
    on it would show.)"""
    result, _ = program_result(hosts, HEAD, REPAIR_PROGRAM, hosts.ray_address)
    before, after, silent, lost = (result[key] for key in ("before", "after", "silent", "lost"))
    assert len(set(before)) == 2 and len(lost) == 2  # spread: two actors on each host
    assert silent not in after
    assert [after[i] for i in range(4) if i not in lost] == [
        before[i] for i in range(4) if i not in lost
    ]


RAY_CLIENT_PROGRAM = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from stratoflow.distributed import launcher, ray_launcher
from stratoflow.distributed.cluster import PlannedMember
plan = [PlannedMember(f"worker {i}", "worker", i, "tests.support.echo_program") for i in (0, 1)]
result = ray_launcher.run_cluster(
    plan, "worker 0", {"value": 1, "announce": True}, address=sys.argv[1],
    placement="strict_spread", restarts=launcher.Restarts(0),
)
print("RESULT", json.dumps(result))
"""


def test_a_host_without_a_ray_node_drives_the_cluster_through_ray_client(hosts):
    """As the docker-compose scheduler does (`ray://ray-head:10001`): members still placed on
    the worker hosts, one each, their output back in the driver's log."""
    address = f"ray://{hosts.address_of(HEAD)}:{CLIENT_PORT}"
    result, log_text = program_result(hosts, CLIENT, RAY_CLIENT_PROGRAM, address)
    assert result["value"] == 2
    placed = {node.split()[0] for node in result["nodes"].values()}
    assert placed == {hosts.address_of(host) for host in hosts.worker_hosts}
    assert "worker 1 started (pid" in log_text


def test_the_cluster_refuses_a_driver_without_its_token(hosts):
    """Token authentication is on: a driver with another token cannot connect."""
    program = (
        "from stratoflow.distributed import ray_launcher\n"
        "import sys\n"
        "try:\n"
        "    ray_launcher.connect(sys.argv[1])\n"
        "except ray_launcher.RayClusterError as error:\n"
        "    print('REFUSED', error)\n"
        "else:\n"
        "    print('CONNECTED')\n"
    )
    env = {**hosts.env(), "RAY_AUTH_TOKEN": "0" * 64}
    env.pop("RAY_AUTH_TOKEN_PATH")
    done = subprocess.run(
        hosts.in_host(HEAD, [sys.executable, "-c", program, hosts.ray_address]),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "REFUSED" in done.stdout, done.stdout + done.stderr[-2000:]


def test_nothing_of_the_cluster_listens_in_the_machines_own_namespace(hosts):
    """Every Ray process runs in a host namespace; the machine's own namespace (the one this
    test reads sockets in) has no socket of theirs, and no route to the hosts' subnet."""
    ours = {pid for host in hosts.namespaces for pid in hosts.pids(host)}
    assert len(ours) > 5, "the hosts run no Ray cluster"
    ray_listening = []
    for connection in psutil.net_connections("inet"):
        if connection.status != psutil.CONN_LISTEN or connection.pid is None:
            continue
        try:
            command = " ".join(psutil.Process(connection.pid).cmdline())
        except psutil.Error:
            continue
        if connection.pid in ours or "ray" in command.split("/")[-1] or "raylet" in command:
            ray_listening.append((connection.laddr, command[:100]))
    assert ray_listening == []
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert SUBNET not in routes
