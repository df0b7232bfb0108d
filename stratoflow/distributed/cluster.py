"""Cluster layouts for the multi-process strategies: loopback ports and each process's TF_CONFIG.

Pure functions, no processes (those are `stratoflow.distributed.launcher`'s). TensorFlow's gRPC
server binds
`0.0.0.0:PORT` and cannot share a port, so ports are found by binding to port 0 and closing; the
launcher retries with fresh ports if another process took one meanwhile.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratoflow.config import clusters
from stratoflow.config.options import STRATEGIES
from stratoflow.config.training import TrainingConfig

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class ClusterLayout:
    """Which job has which addresses, e.g. {"worker": ["127.0.0.1:4001", ...], "ps": [...]}."""

    jobs: dict[str, list[str]]

    def tf_config(self, job: str, index: int) -> str:
        """The TF_CONFIG (JSON) of task `index` of `job` in this cluster."""
        return json.dumps({"cluster": self.jobs, "task": {"type": job, "index": index}})

    def members(self) -> list[tuple[str, int]]:
        return [
            (job, index) for job, addresses in self.jobs.items() for index in range(len(addresses))
        ]


def local_layout(workers: int, ps: int = 0, chief: bool = False) -> ClusterLayout:
    """A layout on loopback with fresh ports: `workers` workers, `ps` ps and maybe a chief."""
    counts = {"chief": int(chief), "worker": workers, "ps": ps}
    ports = iter(free_ports(sum(counts.values())))
    return ClusterLayout(
        {job: [f"{LOOPBACK}:{next(ports)}" for _ in range(n)] for job, n in counts.items() if n}
    )


TRAINING_MODULE = "stratoflow.training.worker"
SERVER_MODULE = "stratoflow.distributed.server"


class ClusterUnreachableError(RuntimeError):
    """A standing cluster server does not accept connections."""


def training_members(training: TrainingConfig) -> tuple[Callable[[], list[Any]], str]:
    """The processes a training run needs, and which one's result is the run's result.

    Returns:
        A function making the members (fresh ports each call, for the launcher's retry on a port
        clash) and the name of the member that reports the result.

    Raises:
        ClusterUnreachableError: a server of the run's standing cluster does not answer.
    """
    from stratoflow.distributed.launcher import Member

    traits = STRATEGIES[training.strategy]
    if traits.uses_ps and training.cluster:
        # By name: the addresses are the deployment's, read here, never from the run's conf.
        standing = clusters.standing_cluster(training.cluster)
        check_reachable(standing)

        # Only the coordinator is ours: the workers and ps are already serving.
        def coordinator_only() -> list[Member]:
            chief = f"{os.environ.get('STRATOFLOW_COORDINATOR_HOST', LOOPBACK)}:{free_ports(1)[0]}"
            layout = ClusterLayout({**standing, "chief": [chief]})
            return [Member("coordinator", TRAINING_MODULE, _env(layout, "chief", 0))]

        return coordinator_only, "coordinator"
    if traits.uses_ps:
        # This task's child coordinates; workers and ps are plain `tf.distribute.Server`s.
        def parameter_server_cluster() -> list[Member]:
            layout = local_layout(training.workers, training.ps, chief=True)
            servers = [
                Member(
                    f"{job} {index}",
                    SERVER_MODULE,
                    _env(
                        layout, job, index, _host_share(training.workers) if job == "worker" else {}
                    ),
                    server=True,
                    rejoins=job == "worker",
                )
                for job, index in layout.members()
                if job != "chief"
            ]
            return [*servers, Member("coordinator", TRAINING_MODULE, _env(layout, "chief", 0))]

        return parameter_server_cluster, "coordinator"
    if traits.uses_workers:
        # Every worker runs the same training program; worker 0 is the chief.
        def multi_worker_cluster() -> list[Member]:
            layout = local_layout(training.workers)
            return [
                Member(
                    f"worker {index}",
                    TRAINING_MODULE,
                    _env(layout, "worker", index, _host_share(training.workers)),
                )
                for index in range(training.workers)
            ]

        return multi_worker_cluster, "worker 0"
    return (lambda: [Member("training process", TRAINING_MODULE)]), "training process"


@dataclass(frozen=True)
class PlannedMember:
    """One process a run needs, before it has an address: its name, TF job and index, program."""

    name: str
    job: str
    index: int
    module: str
    server: bool = False
    rejoins: bool = False


def planned_members(training: TrainingConfig) -> tuple[list[PlannedMember], str]:
    """The processes a run needs wherever they are placed (the Ray launcher's plan), and which
    one reports the result: the same roles `training_members` gives local processes."""
    traits = STRATEGIES[training.strategy]
    if traits.uses_ps:
        servers = [
            PlannedMember(f"{job} {index}", job, index, SERVER_MODULE, True, job == "worker")
            for job, count in (("worker", training.workers), ("ps", training.ps))
            for index in range(count)
        ]
        return [*servers, PlannedMember("coordinator", "chief", 0, TRAINING_MODULE)], "coordinator"
    if traits.uses_workers:
        workers = [
            PlannedMember(f"worker {index}", "worker", index, TRAINING_MODULE)
            for index in range(training.workers)
        ]
        return workers, "worker 0"
    return [PlannedMember("training process", "", 0, TRAINING_MODULE)], "training process"


def member_env(layout: ClusterLayout | None, member: PlannedMember) -> dict[str, str]:
    """The TF_CONFIG (and gRPC setting) of a planned member in `layout` (none alone)."""
    if layout is None or not member.job:
        return {}
    return _env(layout, member.job, member.index)


def check_reachable(jobs: dict[str, list[str]], timeout_seconds: float = 5.0) -> None:
    """Fail fast, naming the server, if a standing cluster member does not accept a connection."""
    for job, addresses in jobs.items():
        for index, address in enumerate(addresses):
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=timeout_seconds).close()
            except OSError as error:
                raise ClusterUnreachableError(
                    f"standing cluster server {job} {index} at {address} is unreachable "
                    f"({error}); start it with `stratoflow serve --job {job} --index {index} "
                    "--cluster ...` or fix the run's cluster setting"
                ) from None


def _env(
    layout: ClusterLayout, job: str, index: int, extra: dict[str, str] | None = None
) -> dict[str, str]:
    # GRPC_FAIL_FAST: a dead peer fails the call at once instead of being waited for.
    return {
        "TF_CONFIG": layout.tf_config(job, index),
        "GRPC_FAIL_FAST": "use_caller",
        **(extra or {}),
    }


def _host_share(workers: int) -> dict[str, str]:
    """Each of `workers` processes on this host computes with its share of the cores.

    TensorFlow gives every process as many intra-op threads as the host has cores, so N local
    workers would run N x cores threads on the cores and wait on each other's preempted threads
    at every collective. A TF_NUM_INTRAOP_THREADS already set by the user wins.
    """
    if "TF_NUM_INTRAOP_THREADS" in os.environ:
        return {}
    return {"TF_NUM_INTRAOP_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def this_process_is_chief() -> bool:
    """From TF_CONFIG, before TensorFlow starts: the chief, worker 0 if none, or no cluster."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return True
    config = json.loads(raw)
    task = config.get("task", {})
    if task.get("type") == "chief":
        return True
    return (
        task.get("type") == "worker"
        and int(task.get("index", 0)) == 0
        and "chief" not in config["cluster"]
    )


def workers_in_cluster() -> int:
    """How many workers this process's TF_CONFIG names (1 without a cluster)."""
    raw = os.environ.get("TF_CONFIG")
    return len(json.loads(raw)["cluster"].get("worker", [])) or 1 if raw else 1
