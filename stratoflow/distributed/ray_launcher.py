"""Runs a training cluster on a standing Ray cluster: one placement group, one actor per member.

Ray only places, starts, watches and restarts the processes; TensorFlow's own gRPC runtime does
all the communication. The whole TensorFlow cluster (workers, parameter servers, coordinator) is
reserved at once as a placement group, one bundle per member, so it starts as a gang or not at
all. Each bundle holds a small actor (`MemberHost`) that finds the node's address and a free port
there, then runs the member's program (`python -m stratoflow.training.worker` or
`stratoflow.distributed.server`, exactly as the local launcher does) as its child, with the
TF_CONFIG built from every member's node address and port. The driver (this process) supervises
the actors with the local launcher's rules (`stratoflow.distributed.launcher.Cluster`): their
output goes to this process's log, the first member lost or failed takes the others down, and a
lost member (killed, or its node dead or unreachable) restarts the cluster from its last
checkpoint within the run's `max_restarts`. The gang of actors (`_Gang`) outlives a restart:
the members start again in the actors they had (from the warm spare each keeps, with
`warm_spares`), and the actors of a lost node are replaced while the others stay.

Actors of a standing cluster do not inherit this process's environment: what the members need
(the data and state folders, the team's own variables) is passed to them explicitly
(`FORWARDED_ENV`); nothing of MLflow's: the chief's reports come back with its output, and this
process logs them. A member's process gets the node's environment only through the allowlist
of `member_environment`: the Ray token of the node (and this driver's) never reaches it. The driver
needs a Ray node on its own host (`ray.init` of an existing cluster connects to the local
raylet): docs/how-to/several-machines.md.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stratoflow.config import locations, names
from stratoflow.config.discovery import PIPELINES_PATH_ENV
from stratoflow.config.strategies import ClusterPlan, PlannedMember
from stratoflow.distributed.cluster import ClusterLayout, free_ports, host_share, member_env
from stratoflow.distributed.launcher import (
    ChildProcessFailed,
    Cluster,
    Member,
    MemberLost,
    Running,
    retry_port_clashes,
    with_restarts,
)
from stratoflow.distributed.member_environment import pipeline_environment, team_variables
from stratoflow.distributed.processes import start_reading_lines
from stratoflow.distributed.protocol import (
    PROCESS_START_ENV,
    ReportSink,
    Restarts,
    TrainingPayload,
    TrainingResult,
)
from stratoflow.distributed.spares import Spares

logger = logging.getLogger(__name__)

# Ray's placement-group strategies by the name a run gives them (`TrainingConfig.placement`).
PLACEMENT_STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict_spread": "STRICT_SPREAD"}
# How long Ray may take to reserve the whole cluster before the run fails, naming what is free.
PLACEMENT_TIMEOUT_SECONDS = 120.0
# Actors placed: how long they may take to report their node (a new worker process imports Ray).
ACTOR_START_TIMEOUT_SECONDS = 120.0
# A member whose node has not answered for this long is given up as unreachable.
UNREACHABLE_SECONDS = 20.0
# How many starts may find a member's port taken (each start asks the nodes for fresh ports).
PORT_CLASH_ATTEMPTS = 3
# How often each member is asked for its new output and state.
POLL_INTERVAL_SECONDS = 0.5
# Variables every member needs from this process: actors get the node's environment, not ours.
# Each is allowlisted (`member_environment`); the team's own variables go with them. Nothing of
# MLflow's: the members report to this process, which logs (`protocol.report`).
FORWARDED_ENV = (
    locations.DATA_DIR_ENV,
    locations.STATE_DIR_ENV,
    PIPELINES_PATH_ENV,  # a team's own pipelines: each node mounts them at the same path
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_NUM_INTRAOP_THREADS",
    "PYTHONPATH",
)
NAMESPACE = "stratoflow"
THREADS_ENV = "TF_NUM_INTRAOP_THREADS"
# Ray starts its worker processes at nice 15 (to keep its own daemons responsive), so a member
# would yield the cores to any nice-0 work scheduled beside it (an Airflow worker on the node,
# another run's local members); Ray's job supervisor puts its drivers back at the raylet's level
# the same way: this variable in the actor's runtime environment.
RAY_NICENESS_ENV = "RAY_worker_niceness"
# Where Linux names this boot of the kernel: the same in every network namespace or container
# on one machine, so members there share its cores.
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class RayClusterError(ChildProcessFailed):
    """The Ray cluster cannot be reached, or cannot place the whole training cluster."""


class MemberHost:
    """The Ray actor behind one member: runs its program as a child on the actor's node.

    The child dies with the actor (`PR_SET_PDEATHSIG`), so a killed actor or node leaves no
    training process behind. It gets the node's allowlisted environment
    (`member_environment`), then what the driver sends.
    """

    def __init__(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="stratoflow-child-")
        self.process: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None
        self.lines: list[str] = []
        self.lock = threading.Lock()
        # Empty unless the driver asks for a spare (a run's `warm_spares`).
        self.spares = Spares(self._inherited())

    def node(self) -> dict[str, Any]:
        """This node's address, host name, machine, CPU count (and whether the node sets its
        members' intra-op threads itself) and a port free on it a moment ago."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "machine": machine_id(),
            "port": free_ports(1)[0],
            "cpus": os.cpu_count(),
            "sets_threads": THREADS_ENV in os.environ,
        }

    def start(self, module: str, payload: str, env: dict[str, str]) -> int:
        """Start (or start again) `python -m module PAYLOAD RESULT`, from this actor's warm
        spare if it keeps one; returns its pid."""
        self._stop_process()
        payload_path = Path(self.workdir) / "payload.json"
        result_path = Path(self.workdir) / "result.json"
        payload_path.write_text(payload)
        result_path.unlink(missing_ok=True)
        command = [sys.executable, "-m", module, str(payload_path), str(result_path)]
        member_env = {**self._inherited(), **env}
        spare = self.spares.take(module)
        if spare is not None:
            spare.become(command, member_env, self._take_line)
            self.process, self.reader = spare.process, spare.reader
        else:
            self.process, self.reader = start_reading_lines(command, member_env, self._take_line)
        return self.process.pid

    def keep_spare(self, module: str) -> None:
        """Keep one warm spare for member program `module` on this actor's node
        (`stratoflow.distributed.spares`): the next `start` here becomes it."""
        self.spares.fill(1, module)

    def _inherited(self) -> dict[str, str]:
        # The node's environment holds its Ray token: the member gets the allowlist. Ray pins
        # 1-CPU actors to one OpenMP thread; TensorFlow's pools are sized by the driver
        # (`thread_shares`), as the local launcher's.
        allowed = pipeline_environment(os.environ)
        return {
            **{k: v for k, v in allowed.items() if k != "OMP_NUM_THREADS"},
            "TMPDIR": self.workdir,
        }

    def _take_line(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def poll(self) -> dict[str, Any]:
        """New output lines, the exit status (None while running) and the result, once done."""
        returncode = self.process.poll() if self.process else None
        if returncode is not None and self.reader is not None:
            self.reader.join(timeout=5)
        with self.lock:
            lines, self.lines = self.lines, []
        result_path = Path(self.workdir) / "result.json"
        result = None
        if returncode is not None and result_path.exists():
            result = json.loads(result_path.read_text())
        spare_warm = any(spare.warm for spare in self.spares.waiting)
        return {
            "lines": lines,
            "returncode": returncode,
            "result": result,
            "spare_warm": spare_warm,
        }

    def signal_member(self, signum: int) -> None:
        """Send the member's process a signal (the tests kill a member this way)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop_member(self) -> None:
        """Kill the member's process (the actor and its spare stay for the next start)."""
        self._stop_process()

    def stop(self) -> None:
        """Kill the member's process and the spare, and remove the work folder."""
        self._stop_process()
        self.spares.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_process(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()


class RayLauncher:
    """The `ray` launcher: a run's members as actors on the Ray cluster at `address`, reserved
    as one placement group (`placement`: "pack", "spread" or "strict_spread")."""

    def __init__(self, address: str, placement: str = "pack", token: str | None = None):
        self.address = address
        self.placement = placement
        self.token = token

    def run(
        self,
        plan: ClusterPlan,
        payload: TrainingPayload,
        restarts: Restarts,
        reports: ReportSink | None = None,
    ) -> TrainingResult:
        """Run `plan`'s members on Ray (`stratoflow.distributed.protocol.Launcher.run`); the
        result says on which node each member ran.

        Raises:
            RayClusterError: Ray cannot be reached or cannot place the whole cluster.
            ChildProcessFailed: a member failed, or was lost more often than `restarts` allows.
        """
        result = run_cluster(
            plan.members,
            plan.result_from,
            payload.to_json(),
            address=self.address,
            placement=self.placement,
            restarts=restarts,
            token=self.token,
            reports=reports,
            warm_spares=payload.plan.training.warm_spares,
        )
        return TrainingResult.from_dict(result)


def run_cluster(
    plan: Sequence[PlannedMember],
    result_from: str,
    payload: dict[str, Any] | str,
    *,
    address: str,
    placement: str = "pack",
    restarts: Restarts | None = None,
    timeout_seconds: float | None = None,
    token: str | None = None,
    reports: ReportSink | None = None,
    warm_spares: bool = False,
) -> dict[str, Any]:
    """Run the planned members on the Ray cluster at `address`; the result member's result.

    Args:
        plan: the members (`stratoflow.config.strategies.planned_members`).
        result_from: the member whose result is the run's result.
        payload: JSON-able input, or its JSON text: the same for every member.
        address: the Ray cluster (host:port of its head's GCS, or "auto").
        placement: "pack", "spread" or "strict_spread" (`PLACEMENT_STRATEGIES`).
        restarts: the budget for lost members (none by default); records each restart.
        timeout_seconds: fail if one start of the cluster takes longer.
        token: the Ray token to present (`connect`); None: this node's own.
        reports: takes the members' reports (`protocol.report`) as the supervision polls them.
        warm_spares: once training runs, every member's actor keeps a spare of its program
            with TensorFlow imported (`MemberHost.keep_spare`).

    Returns:
        The result member's result, with `nodes`: member name -> "ip (hostname)".

    Raises:
        RayClusterError: Ray cannot be reached or cannot place the whole cluster.
        ChildProcessFailed: a member failed or was lost more often than `restarts` allows.
    """
    import ray

    connect(address, token)
    budget = restarts or Restarts(0)
    gangs = _Gangs(len(plan), placement)
    try:

        def start_once() -> dict[str, Any]:  # fresh ports each start; a new gang if one was lost
            return _RayCluster(
                plan, result_from, payload, gangs, budget, timeout_seconds, reports, warm_spares
            ).run()

        return with_restarts(lambda: retry_port_clashes(start_once, PORT_CLASH_ATTEMPTS), budget)
    finally:
        gangs.close()
        ray.shutdown()


# A Ray Client address (`ray://`) is served by a server process the head starts per driver.
# Under load that process can die while it starts (Ray's proxier then fails the connection,
# seen once in CI: psutil.ZombieProcess in `start_specific_server`); a second attempt starts a
# fresh one. Not when nothing answered (Ray's "connection timeout", after about 30 s): a second
# wait would only double the time to the error. A GCS address has no such step: one attempt.
RAY_CLIENT_ATTEMPTS = 2
RAY_CLIENT_RETRY_PAUSE_SECONDS = 2.0
# Where a Ray driver takes its token from: the variable first, else the file the other names.
RAY_TOKEN_ENV = "RAY_AUTH_TOKEN"
RAY_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


def connect(address: str, token: str | None = None) -> None:
    """Connect this process to the Ray cluster at `address` as a driver.

    `token` (a Ray cluster's Airflow Connection holds one) replaces this node's token file for
    the connection: Ray reads `$RAY_AUTH_TOKEN` before the file. Members never see it: their
    environment is an allowlist (`member_environment`), and actors get their node's.

    Raises:
        RayClusterError: no cluster answers there (or this host has no Ray node).
    """
    import ray

    if token is not None:
        os.environ[RAY_TOKEN_ENV] = token
        os.environ.pop(RAY_TOKEN_PATH_ENV, None)
    attempts = RAY_CLIENT_ATTEMPTS if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        if ray.is_initialized():
            ray.shutdown()
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,  # members' output comes through `MemberHost.poll`
                logging_level=logging.WARNING,
            )
            return
        except Exception as error:
            if attempt < attempts and "connection timeout" not in str(error):
                logger.warning(
                    "connecting to the Ray cluster at %s failed (%s: %s); trying again",
                    address,
                    type(error).__name__,
                    error,
                )
                time.sleep(RAY_CLIENT_RETRY_PAUSE_SECONDS)
                continue
            raise RayClusterError(
                f"cannot connect to the Ray cluster at {address!r}: {type(error).__name__}: "
                f"{error}. This host needs a Ray node of that cluster (`ray start "
                "--address=...`) and its auth token (docs: how-to/several-machines.md)"
            ) from None


class _ActorRunning(Running):
    """A member run by a `MemberHost` actor, as the supervision sees it."""

    def __init__(
        self,
        member: Member,
        actor: Any,
        node: dict[str, Any],
        payload: str,
        reports: ReportSink | None = None,
        lost_nodes: set[str] | None = None,
    ):
        import ray

        super().__init__(member, reports)
        self.actor, self.node, self.payload = actor, node, payload
        # The nodes the cluster's members were lost with (shared by them): nothing on one of
        # them is asked to stop.
        self.lost_nodes = lost_nodes if lost_nodes is not None else set()
        self.pid = ray.get(actor.start.remote(member.module, payload, member.env), timeout=60)
        self.returncode: int | None = None
        self.final: dict[str, Any] | None = None
        self.pending: Any = None
        self.asked_at = self.heard_at = time.monotonic()
        self.lost: str | None = None
        # Whether its node stopped answering (not an actor Ray saw die on a node that lives on):
        # a node new actors are not placed on.
        self.unreachable = False
        # The spare asked of this member's actor since its process started; whether it is warm.
        self.spare_asked = self.spare_warm = False
        logger.info(
            "%s started (pid %d on node %s): python -m %s",
            member.name,
            self.pid,
            describe_node(node),
            member.module,
        )

    def refresh(self, wait: float = 0.0) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self.lost is not None or self.returncode is not None:
            return
        now = time.monotonic()
        if self.pending is None:
            if now - self.asked_at < POLL_INTERVAL_SECONDS:
                return
            self.pending, self.asked_at = self.actor.poll.remote(), now
        ready, _ = ray.wait([self.pending], timeout=wait)
        if not ready:
            if now - self.heard_at > UNREACHABLE_SECONDS:
                self.lost = (
                    f"is unreachable: its node {describe_node(self.node)} has not answered for "
                    f"{now - self.heard_at:.0f} s"
                )
                self.lost_nodes.add(self.node["node_id"])
                self.unreachable = True
            return
        try:
            state = ray.get(self.pending, timeout=5)
        except (RayActorError, GetTimeoutError) as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.lost = (
                f"was lost with its node {describe_node(self.node)} "
                f"({type(error).__name__}: {first_line})"
            )
            self.lost_nodes.add(self.node["node_id"])
            self.unreachable = node_stopped_answering(error)
            return
        finally:
            self.pending = None
        self.heard_at = time.monotonic()
        for line in state["lines"]:
            self.take_line(line)
        self.returncode, self.final = state["returncode"], state["result"]
        if state["spare_warm"] and not self.spare_warm:
            logger.info("warm spare ready beside %s (%s)", self.member.name, self.where())
        self.spare_warm = state["spare_warm"]

    def on_lost_node(self) -> str | None:
        """Why the member is gone: lost itself, or on a node another member was lost with."""
        if self.lost is None and self.node["node_id"] in self.lost_nodes:
            return f"was on node {describe_node(self.node)}, lost with another member"
        return self.lost

    def keep_spare(self) -> None:
        """Have this member's actor keep a warm spare of its program (once per start)."""
        if not self.spare_asked and self.lost is None:
            self.actor.keep_spare.remote(self.member.module)
            self.spare_asked = True

    def poll(self) -> int | None:
        return self.returncode

    def lost_reason(self) -> str | None:
        return self.lost

    def restart(self) -> None:
        import ray

        self.ready_at, self.restarted_at = None, time.monotonic()
        self.returncode = self.final = None
        self.spare_asked = self.spare_warm = False
        self.pid = ray.get(
            self.actor.start.remote(self.member.module, self.payload, self.member.env), timeout=60
        )
        logger.info("%s started again (pid %d)", self.member.name, self.pid)

    def result(self) -> dict[str, Any] | None:
        return self.final

    def where(self) -> str:
        return f"pid {self.pid} on node {describe_node(self.node)}"

    def drain(self) -> None:
        if self.lost is None:
            self.refresh(wait=3.0)

    def kill(self) -> None:
        """Kill the member's process; its actor stays (the gang's to end)."""
        import ray

        if self.on_lost_node() is None and self.returncode is None:
            try:
                ray.get(self.actor.stop_member.remote(), timeout=10)
            except Exception:  # the actor or its node is gone: nothing left to stop there
                logger.debug("could not stop %s", self.member.name, exc_info=True)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL


def machine_id() -> str:
    """This machine (its kernel's boot id; the host name where there is none)."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return socket.gethostname()


def member_niceness() -> int:
    """The nice level members start at on their node, relative to its raylet: this driver's
    own, as the local launcher's members inherit it (never below 0: raising a process's
    priority takes a privilege Ray's workers do not have)."""
    return max(0, os.getpriority(os.PRIO_PROCESS, 0))


def thread_shares(
    plan: Sequence[PlannedMember], nodes: Sequence[dict[str, Any]]
) -> list[dict[str, str]]:
    """Each planned member's intra-op threads (`host_share`), the workers on one machine
    splitting its cores as the local launcher's do on its host; nothing for the other members,
    nor where the node or this driver sets TF_NUM_INTRAOP_THREADS itself."""
    placed = list(zip(plan, nodes, strict=True))
    workers_on = collections.Counter(node["machine"] for p, node in placed if p.job == "worker")
    return [
        host_share(workers_on[node["machine"]], node["cpus"])
        if planned.job == "worker" and not node.get("sets_threads")
        else {}
        for planned, node in placed
    ]


def lost_with_their_nodes(running: Sequence[Running]) -> list[int]:
    """The indices of the members lost, and of those on a node a member was lost with (gone
    with it, though Ray may not have said so yet)."""
    return [
        index
        for index, child in enumerate(running)
        if isinstance(child, _ActorRunning) and child.on_lost_node() is not None
    ]


def node_stopped_answering(error: Exception) -> bool:
    """Whether an actor's `error` says its node stopped answering. Ray says an actor died
    (`ActorDiedError`) once it knows, and then places nothing on a dead node; an actor whose
    node died before Ray noticed is unavailable (or its call times out)."""
    from ray.exceptions import ActorDiedError

    return not isinstance(error, ActorDiedError)


def unreachable_nodes(running: dict[str, Running]) -> set[str]:
    """The Ray ids of the nodes a member's actor could not be reached on."""
    return {
        child.node["node_id"]
        for child in running.values()
        if isinstance(child, _ActorRunning) and child.unreachable
    }


def describe_node(node: dict[str, Any]) -> str:
    return f"{node['ip']} ({node['hostname']})"


class _Gang:
    """A run's actors, one `MemberHost` per member, each in a bundle of a placement group.

    Kept from one start of the cluster to the next while every actor answers: a member that was
    killed starts again in the same actor (from its warm spare, if it keeps one), without a new
    reservation. When actors are lost with their node, the others stay (with their spares) and
    new actors take the lost ones' places, in a placement group of their own (`repair`): Ray
    marks a dead node dead only after some 15 s of missed heartbeats, and until then the first
    group's bundles there are neither usable nor moved. The new group's bundles avoid the nodes
    that stopped answering: until Ray marks such a node dead it tries to reserve bundles there
    too (1.4-2.1 s of a host loss's recovery went on that).
    """

    def __init__(self, size: int, placement: str):
        self.size, self.placement = size, placement
        self.groups: list[Any] = []
        self.actors: list[Any] = []
        # The indices of the actors lost (all, where it is not known which): the gang is not
        # used again as it is, and nothing waits on a lost actor to stop.
        self.lost: set[int] = set()
        # The Ray ids of the nodes actors could not be reached on: no new actor is placed there.
        self.silent_nodes: set[str] = set()
        try:
            group = self._reserve(size, PLACEMENT_TIMEOUT_SECONDS)
        except BaseException:
            self.close()  # the reservation Ray is still trying to place
            raise
        self.actors = [self._new_actor(group, index) for index in range(size)]

    def _reserve(self, bundles: int, timeout: float) -> Any:
        """A placement group of `bundles` 1-CPU bundles, placed, none of them on a node that
        stopped answering (`silent_nodes`).

        Raises:
            RayClusterError: Ray could not place it within `timeout`.
        """
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

        strategy = PLACEMENT_STRATEGIES[self.placement]
        avoiding = (
            [{NODE_ID_LABEL_KEY: f"!in({', '.join(sorted(self.silent_nodes))})"}] * bundles
            if self.silent_nodes
            else None
        )
        group = placement_group(
            [{"CPU": 1}] * bundles, strategy=strategy, bundle_label_selector=avoiding
        )
        self.groups.append(group)
        try:
            ray.get(group.ready(), timeout=timeout)
        except GetTimeoutError:
            nodes = [node for node in ray.nodes() if node["Alive"]]
            free = ray.available_resources().get("CPU", 0)
            raise RayClusterError(
                f"Ray could not place the {bundles} cluster members "
                f"(placement {self.placement!r}, 1 CPU each) within {timeout:.0f} s: the Ray "
                f"cluster has {len(nodes)} live node(s) and {free:g} free CPU(s); add nodes, or "
                "choose placement 'pack'"
            ) from None
        return group

    def _new_actor(self, group: Any, index: int) -> Any:
        """A `MemberHost` in bundle `index` of `group`, at this driver's nice level
        (`member_niceness`)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host = ray.remote(num_cpus=1, max_restarts=0)(MemberHost)
        return host.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=index
            ),
            runtime_env={"env_vars": {RAY_NICENESS_ENV: str(member_niceness())}},
        ).remote()

    def repairable(self) -> bool:
        """Some actors were lost, it is known which, and the placement lets new ones go
        anywhere (`strict_spread` keeps members off each other's nodes: a new gang)."""
        return 0 < len(self.lost) < self.size and self.placement != "strict_spread"

    def repair(self) -> None:
        """New actors for the lost ones, in a new placement group beside the gang's.

        Raises:
            RayClusterError: the live nodes have no room for them within `REPAIR_SECONDS`.
        """
        import ray

        lost = sorted(self.lost)
        group = self._reserve(len(lost), REPAIR_SECONDS)
        for bundle, index in enumerate(lost):
            ray.kill(self.actors[index], no_restart=True)
            self.actors[index] = self._new_actor(group, bundle)
        logger.info(
            "the cluster keeps %d of its %d actors; new actors take the lost ones' places",
            self.size - len(lost),
            self.size,
        )
        self.lost.clear()

    def nodes(self, timeout: float = ACTOR_START_TIMEOUT_SECONDS) -> list[dict[str, Any]]:
        """Each actor's node, with a port free there now (`MemberHost.node`).

        Raises:
            MemberLost: an actor did not answer within `timeout` (its node died after the
                reservation, and Ray has not noticed yet); every actor counts as lost.
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return list(ray.get([actor.node.remote() for actor in self.actors], timeout=timeout))
        except (GetTimeoutError, RayActorError) as error:
            self.lose(range(len(self.actors)))  # which one is not known: wait on none
            raise MemberLost(
                f"the cluster's actors did not answer on their nodes ({type(error).__name__})",
                "a member's node",
            ) from None

    def lose(self, indices: Sequence[int], unreachable: Iterable[str] = ()) -> None:
        """Note the actors at `indices` as lost, and the Ray ids of the nodes that became
        `unreachable`: the gang is not used again as it is."""
        self.lost.update(indices)
        self.silent_nodes.update(unreachable)

    def close(self) -> None:
        """Stop every member and spare, end the actors, free the reservations."""
        import ray
        from ray.util.placement_group import remove_placement_group

        # Their work folders and spares; a lost actor has nothing left to clean (and waiting on
        # one cut off would only delay the run's end).
        stopping = [
            actor.stop.remote() for index, actor in enumerate(self.actors) if index not in self.lost
        ]
        if stopping:
            ray.wait(stopping, num_returns=len(stopping), timeout=STOP_SECONDS)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for group in self.groups:
            remove_placement_group(group)


# How long the gang's actors may take to stop their members and spares before they are killed.
STOP_SECONDS = 10.0
# How long a kept gang's actors may take to answer before it is given up for a new one.
KEPT_GANG_ANSWER_SECONDS = 10.0
# How long the live nodes may take to make room for new actors in a gang's lost places before a
# whole new gang is placed instead.
REPAIR_SECONDS = 30.0


class _Gangs:
    """The gang each start of a run's cluster uses: the last one (new actors in a lost node's
    places) while that works, else a new one."""

    def __init__(self, size: int, placement: str):
        self.size, self.placement = size, placement
        self.current: _Gang | None = None

    def ready(self) -> tuple[_Gang, list[dict[str, Any]]]:
        """A whole gang and its actors' nodes (fresh ports on each call): the last one, with
        new actors for those it lost, while that works; else a new one."""
        if self.current is not None and self.current.repairable():
            try:
                self.current.repair()
                return self.current, self.current.nodes(REPAIR_SECONDS)
            except (RayClusterError, MemberLost) as error:
                logger.info("the lost actors' places could not be filled (%s): a new gang", error)
        elif self.current is not None and not self.current.lost:
            try:
                return self.current, self.current.nodes(KEPT_GANG_ANSWER_SECONDS)
            except MemberLost:
                logger.info("an actor of the cluster no longer answers: placing a new gang")
        self.close()
        self.current = _Gang(self.size, self.placement)
        return self.current, self.current.nodes()

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


class _RayCluster(Cluster):
    def __init__(
        self,
        plan: Sequence[PlannedMember],
        result_from: str,
        payload: dict[str, Any] | str,
        gangs: _Gangs,
        restarts: Restarts,
        timeout_seconds: float | None,
        reports: ReportSink | None = None,
        warm_spares: bool = False,
    ):
        super().__init__(
            [], result_from, payload, timeout_seconds, restarts=restarts, reports=reports
        )
        self.plan = plan
        self.gangs = gangs
        self.warm_spares = warm_spares
        self.launched = time.time()

    def run(self) -> dict[str, Any]:
        from ray.exceptions import GetTimeoutError, RayActorError

        # The members' start time (seconds_to_first_step counts from it) is the reservation's:
        # placing the gang and starting its actors is part of what a run waits for.
        self.launched = time.time()
        gang, nodes = self.gangs.ready()
        running: dict[str, Running] = {}
        lost_nodes: set[str] = set()
        try:
            members = self._members(nodes)
            text = self.payload
            for member, actor, node in zip(members, gang.actors, nodes, strict=True):
                try:
                    running[member.name] = _ActorRunning(
                        member, actor, node, text, self.reports, lost_nodes
                    )
                except (GetTimeoutError, RayActorError) as error:
                    gang.lose([len(running)])
                    raise MemberLost(
                        f"{member.name} could not be started on node {describe_node(node)} "
                        f"({type(error).__name__})",
                        member.name,
                    ) from None
            self.supervise(running)
            result = self.result_of(running[self.result_from])
            result["nodes"] = {
                m.name: describe_node(n) for m, n in zip(members, nodes, strict=True)
            }
            return result
        finally:
            for child in running.values():
                child.kill()
            gang.lose(lost_with_their_nodes(list(running.values())), unreachable_nodes(running))

    def keep_spares(self, running: dict[str, Running]) -> None:
        """Every member keeps a spare of its own program in its actor: a rejoining worker
        starts again there, and a restart reuses the gang, or what a lost node left of it."""
        if not self.warm_spares:
            return
        for child in running.values():
            assert isinstance(child, _ActorRunning)
            child.keep_spare()

    def _members(self, nodes: list[dict[str, Any]]) -> list[Member]:
        """The members with their TF_CONFIG from the nodes' addresses and ports."""
        jobs: dict[str, list[str]] = {}
        for planned, node in zip(self.plan, nodes, strict=True):
            if planned.job:
                jobs.setdefault(planned.job, []).append(f"{node['ip']}:{node['port']}")
        layout = ClusterLayout(jobs) if jobs else None
        placed = {m.name: describe_node(n) for m, n in zip(self.plan, nodes, strict=True)}
        forwarded = {
            **{name: os.environ[name] for name in FORWARDED_ENV if name in os.environ},
            **team_variables(os.environ),
        }
        started = str(self.launched)
        return [
            Member(
                planned.name,
                planned.module,
                {
                    **forwarded,
                    **member_env(layout, planned, threads),
                    names.NODES_ENV: json.dumps(placed),
                    PROCESS_START_ENV: started,
                },
                server=planned.server,
                rejoins=planned.rejoins,
            )
            for planned, threads in zip(self.plan, thread_shares(self.plan, nodes), strict=True)
        ]
