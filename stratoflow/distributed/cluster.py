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
from dataclasses import dataclass

from stratoflow.config.strategies import ClusterPlan, PlannedMember

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


class ClusterUnreachableError(RuntimeError):
    """A standing cluster server does not accept connections."""


# The coordinator's address on a standing cluster: where its servers can reach this host.
COORDINATOR_HOST_ENV = "STRATOFLOW_COORDINATOR_HOST"


def plan_layout(plan: ClusterPlan, standing: dict[str, list[str]]) -> ClusterLayout | None:
    """The TF cluster of `plan`'s members on this host, with fresh ports (None: a lone process).

    With a `standing` cluster (its servers' addresses), the plan's own members join it: on
    `$STRATOFLOW_COORDINATOR_HOST` (default loopback), where the standing servers reach them.
    """
    ours = [member for member in plan.members if member.job]
    if not ours:
        return None
    host = os.environ.get(COORDINATOR_HOST_ENV, LOOPBACK) if standing else LOOPBACK
    own_jobs = {member.job for member in ours}
    jobs = {job: list(addresses) for job, addresses in standing.items() if job not in own_jobs}
    ports = iter(free_ports(len(ours)))
    for member in ours:  # in index order within each job (`planned_members`)
        jobs.setdefault(member.job, []).append(f"{host}:{next(ports)}")
    return ClusterLayout(jobs)


def member_env(
    layout: ClusterLayout | None, member: PlannedMember, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The TF_CONFIG (and gRPC setting) of a planned member in `layout` (none alone), + `extra`."""
    if layout is None or not member.job:
        return {}
    return _env(layout, member.job, member.index, extra)


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


def host_share(workers: int, cores: int | None = None) -> dict[str, str]:
    """Each of `workers` processes on one machine computes with its share of its `cores` (this
    host's by default).

    TensorFlow gives every process as many intra-op threads as the host has cores, so N
    workers on one machine would run N x cores threads on the cores and wait on each other's
    preempted threads at every collective. A TF_NUM_INTRAOP_THREADS already set by the user wins.
    """
    if "TF_NUM_INTRAOP_THREADS" in os.environ:
        return {}
    cores = cores or os.cpu_count() or 1
    return {"TF_NUM_INTRAOP_THREADS": str(max(1, cores // workers))}


def this_process_is_chief() -> bool:
    """Whether this process writes the run's outputs (model, checkpoints, MLflow metrics).

    From TF_CONFIG, so it can be asked before TensorFlow starts: the `chief` task (such as the
    parameter-server coordinator), else worker 0; a process outside a cluster is its own chief.
    """
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
