"""Several hosts on one machine: Linux network namespaces joined by a bridge, with a Ray node in
each (the Ray launcher's multi-host tests and `make bench`).

Ray on Linux listens on every interface of its network namespace and cannot be held to loopback
(docs/BENCHMARKS.md, "Facts"), so every Ray node here runs inside a namespace made for it:
`sfray-head` (the Ray head, no CPUs for members, and the Airflow process that drives the
cluster, as an Airflow worker that is a Ray node would), `sfray-1`, `sfray-2`, ... (the hosts the
members are placed on). Their addresses, 10.213.0.0/24, exist only inside the namespaces; the
bridge lives in a namespace of its own (`sfray-net`), so the machine's own namespace gets no
interface, no address and no route to them: nothing listens there and no packet leaves them.
Token authentication is on, with a token generated for the hosts and kept 0600.

Everything is stopped by process id (every process inside the namespaces), never by name, and
the namespaces are deleted: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

SUBNET = "10.213.0"
NETWORK_NAMESPACE = "sfray-net"
BRIDGE = "sfbr0"
HEAD = "sfray-head"
# A host without a Ray node (as a docker-compose Airflow scheduler): it can reach the cluster
# only through Ray Client.
CLIENT = "sfray-client"
CLIENT_PORT = 10001
GCS_PORT = 6379
PROJECT = str(Path(__file__).resolve().parents[1])
RAY = str(Path(sys.executable).with_name("ray"))
# Logical CPUs per worker host: room for a whole parameter-server cluster (4 members) on either
# host, so a lost host's members can be placed on the other under placement "pack" or "spread".
HOST_CPUS = 4


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class RayHosts:
    """The namespaces, their addresses and the Ray node running in each."""

    workers: int = 2
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sfray-")))
    namespaces: list[str] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        """The hosts with a Ray node."""
        return [HEAD, *self.worker_hosts]

    @property
    def all_hosts(self) -> list[str]:
        return [*self.hosts, CLIENT]

    @property
    def worker_hosts(self) -> list[str]:
        return [f"sfray-{n}" for n in range(1, self.workers + 1)]

    def address_of(self, host: str) -> str:
        return f"{SUBNET}.{self.all_hosts.index(host) + 1}"

    @property
    def ray_address(self) -> str:
        return f"{self.address_of(HEAD)}:{GCS_PORT}"

    @property
    def token_path(self) -> Path:
        return self.root / "ray_auth_token"

    def env(self) -> dict[str, str]:
        """What a Ray node or driver of these hosts needs on top of the current environment."""
        return {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join(
                filter(
                    None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]
                )
            ),
        }

    def in_host(self, host: str, command: Sequence[str]) -> list[str]:
        """`command` run inside host `host`'s namespace."""
        return ["ip", "netns", "exec", host, *command]

    def build(self) -> None:
        """Make the namespaces, the bridge, the links and the addresses."""
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        _ip("netns", "add", NETWORK_NAMESPACE)
        self.namespaces.append(NETWORK_NAMESPACE)
        _ip("-n", NETWORK_NAMESPACE, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", NETWORK_NAMESPACE, "link", "set", BRIDGE, "up")
        for number, host in enumerate(self.all_hosts, start=1):
            _ip("netns", "add", host)
            self.namespaces.append(host)
            port = f"sfv{number}"
            _ip(
                "link", "add", port, "netns", NETWORK_NAMESPACE, "type", "veth",
                "peer", "name", "eth0", "netns", host,
            )  # fmt: skip
            _ip("-n", NETWORK_NAMESPACE, "link", "set", port, "master", BRIDGE, "up")
            _ip("-n", host, "addr", "add", f"{SUBNET}.{number}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            _ip("-n", host, "link", "set", "lo", "up")

    def start_ray(self) -> None:
        """`ray start` in every host: the head first (no CPUs: members go to the other hosts)."""
        started = time.monotonic()
        self._ray_start(
            HEAD, ["--head", f"--port={GCS_PORT}", "--num-cpus=0", "--include-dashboard=false"]
        )
        for host in self.worker_hosts:
            self.start_node(host)
        log.info("Ray on %d hosts up in %.0f s", len(self.hosts), time.monotonic() - started)

    def start_node(self, host: str) -> None:
        """Start (or start again) the Ray node of worker host `host`."""
        self._ray_start(host, [f"--address={self.ray_address}", f"--num-cpus={HOST_CPUS}"])

    def _ray_start(self, host: str, args: list[str]) -> None:
        temp_dir = self.root / host
        temp_dir.mkdir(exist_ok=True)
        command = self.in_host(
            host,
            [
                RAY,
                "start",
                *args,
                f"--node-ip-address={self.address_of(host)}",
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
            ],
        )
        done = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=180)
        if done.returncode:
            raise RuntimeError(f"ray start in {host} failed:\n{done.stdout}\n{done.stderr}")

    def pids(self, host: str) -> list[int]:
        """Every process inside host `host`'s namespace."""
        done = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process of host `host` (its Ray node and whatever runs there)."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def cut_off(self, host: str) -> None:
        """Take host `host`'s link down: its processes live on, unreachable."""
        number = self.all_hosts.index(host) + 1
        _ip("-n", NETWORK_NAMESPACE, "link", "set", f"sfv{number}", "down")

    def reconnect(self, host: str) -> None:
        number = self.all_hosts.index(host) + 1
        _ip("-n", NETWORK_NAMESPACE, "link", "set", f"sfv{number}", "up")

    def ray_memory_mb(self) -> float:
        """Resident memory of the Ray processes of all hosts (not the members they run)."""
        total = 0
        for host in self.hosts:
            for pid in self.pids(host):
                with contextlib.suppress(psutil.Error):
                    process = psutil.Process(pid)
                    if "stratoflow." not in " ".join(process.cmdline()):
                        total += process.memory_info().rss
        return total / 2**20

    def tear_down(self) -> None:
        """Kill every process in the namespaces, delete them and the hosts' folders."""
        for _ in range(3):
            alive = [pid for host in self.namespaces for pid in self.pids(host)]
            if not alive:
                break
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(1)
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.namespaces.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def leftover_namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return sorted(line.split()[0] for line in done.stdout.splitlines() if line.startswith("sfray"))


@contextlib.contextmanager
def ray_hosts(workers: int = 2) -> Iterator[RayHosts]:
    """Hosts with a Ray cluster across them for the duration of the block; nothing left after."""
    if leftover_namespaces():
        raise RuntimeError(f"namespaces of an earlier run are still there: {leftover_namespaces()}")
    hosts = RayHosts(workers)
    try:
        hosts.build()
        hosts.start_ray()
        yield hosts
    finally:
        hosts.tear_down()
