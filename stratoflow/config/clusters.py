"""The deployment's named training clusters: where a run may train outside the task's own host.

Where training runs is the deployment's decision, not a trigger's: a run names a cluster
(`TrainingConfig.cluster`, `TrainingConfig.ray_cluster`) and only a name this module knows is
accepted (the Params are enums of these names, so Airflow refuses anything else at trigger
time). The addresses stay here, in the environment of the deployment's own processes, and are
looked up by name at the moment a task connects: the Ray token and the MLflow account a cluster's
members receive are only ever presented to an address the deployment configured.

- `STRATOFLOW_RAY_CLUSTERS`: a JSON object, name → the Ray cluster's address (`host:port` of
  its head's GCS, `ray://host:port` for Ray Client, or `auto` on a Ray node), or `null` where the
  address is in the Airflow Connection `stratoflow_ray_<name>` (`stratoflow.config.connections`;
  a list of names means every one of them is). Such a connection, where it exists, also
  overrides an address given here, and its password is the Ray token presented to it.
- `STRATOFLOW_CLUSTERS`: a JSON object, name → a standing parameter-server cluster
  (`{"worker": ["host:port", ...], "ps": ["host:port", ...]}`, servers started with
  `stratoflow serve`).
- The older single-cluster variables still work: `STRATOFLOW_RAY_ADDRESS` and
  `STRATOFLOW_CLUSTER` each define the cluster named `default`.

A run that names no cluster uses the one named `default`, when there is one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from stratoflow.config import connections
from stratoflow.config.parsing import SpecError

RAY_CLUSTERS_ENV = "STRATOFLOW_RAY_CLUSTERS"
STANDING_CLUSTERS_ENV = "STRATOFLOW_CLUSTERS"
# The single-cluster variables of earlier versions: each is the cluster named `default`.
RAY_ADDRESS_ENV = "STRATOFLOW_RAY_ADDRESS"
STANDING_CLUSTER_ENV = "STRATOFLOW_CLUSTER"
# The cluster a run uses when it names none.
DEFAULT = "default"

_Target = TypeVar("_Target")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HOST_PORT = re.compile(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}")


class ClusterConfigError(SpecError):
    """The deployment's cluster configuration is malformed (names the variable)."""


def ray_clusters() -> dict[str, str | None]:
    """The deployment's Ray clusters: name → address (None: in its Airflow Connection).

    From `$STRATOFLOW_RAY_CLUSTERS` (and the older `$STRATOFLOW_RAY_ADDRESS`).

    Raises:
        ClusterConfigError: the variable is not a JSON object of names to addresses (or null),
            nor a list of names.
    """
    named = _named(RAY_CLUSTERS_ENV, names_only=True)
    legacy = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    if legacy and DEFAULT not in named:
        named[DEFAULT] = legacy
    for name, address in named.items():
        if address is not None:
            check_ray_address(address, f"${RAY_CLUSTERS_ENV}: cluster {name!r}")
    return {name: None if address is None else str(address) for name, address in named.items()}


def check_ray_address(address: object, where: str) -> str:
    """`address` if it is a Ray cluster's address, else `ClusterConfigError` naming `where`."""
    if not isinstance(address, str) or not (address == "auto" or _HOST_PORT.fullmatch(address)):
        raise ClusterConfigError(
            f"{where} has address {address!r:.80}; expected "
            "'host:port' of the Ray head, 'ray://host:port' or 'auto'"
        )
    return address


@dataclass(frozen=True)
class RayTarget:
    """Where a run's Ray cluster is, and the token to present there.

    Attributes:
        address: the cluster's address.
        token: the Ray token of its Airflow Connection; None: the node's own (its token file).
        source: where the address came from, for logs and errors.
    """

    address: str
    token: str | None
    source: str


def ray_target(name: str, lookup: connections.Lookup = connections.no_connections) -> RayTarget:
    """The address (and token) of the deployment's Ray cluster `name`.

    Its Airflow Connection `stratoflow_ray_<name>` (found through `lookup`) comes first; the
    environment's address is the fallback.

    Raises:
        SpecError: no Ray cluster of that name is configured here (naming the ones that are).
        ClusterConfigError: the cluster's address is in no connection, or a connection is
            malformed.
    """
    address = ray_address(name)
    fields = lookup(connections.ray_connection_id(name))
    if fields is not None:
        return _connection_target(fields)
    if address is None:
        raise ClusterConfigError(
            f"Ray cluster {name!r}: ${RAY_CLUSTERS_ENV} leaves its address to the Airflow "
            f"connection {connections.ray_connection_id(name)!r}, and there is none"
        )
    return RayTarget(address, None, f"${RAY_CLUSTERS_ENV}")


def standing_clusters() -> dict[str, dict[str, list[str]]]:
    """The deployment's standing parameter-server clusters: name → jobs, from the environment.

    Raises:
        ClusterConfigError: `$STRATOFLOW_CLUSTERS` (or `$STRATOFLOW_CLUSTER`) is malformed.
    """
    named = _named(STANDING_CLUSTERS_ENV)
    legacy = os.environ.get(STANDING_CLUSTER_ENV, "").strip()
    if legacy and DEFAULT not in named:
        named[DEFAULT] = legacy
    return {
        name: parse_cluster(
            jobs if isinstance(jobs, str) else json.dumps(jobs),
            f"${STANDING_CLUSTERS_ENV}: cluster {name!r}",
            error=ClusterConfigError,
        )
        for name, jobs in named.items()
    }


def _connection_target(fields: connections.ConnectionFields) -> RayTarget:
    """The Ray cluster a `stratoflow_ray` connection names: its host (and port) and token.

    The token (the connection's password) is required: the node's own token is presented only
    to an address the deployment's environment names, never to one a connection's editor chose.
    """
    where = f"Airflow connection {fields.conn_id!r}"
    host = fields.host or ""
    address = check_ray_address(f"{host}:{fields.port}" if fields.port else host, where)
    if not fields.password:
        raise ClusterConfigError(
            f"{where}: password is empty; expected the Ray cluster's auth token"
        )
    return RayTarget(address, fields.password, where)


def ray_address(name: str) -> str | None:
    """The address of the deployment's Ray cluster `name` (None: in its Airflow Connection).

    Raises:
        SpecError: no Ray cluster of that name is configured here (naming the ones that are).
    """
    return _lookup(ray_clusters(), name, "ray_cluster", RAY_CLUSTERS_ENV)


def standing_cluster(name: str) -> dict[str, list[str]]:
    """The jobs (`worker`, `ps` addresses) of the deployment's standing cluster `name`.

    Raises:
        SpecError: no standing cluster of that name is configured here.
    """
    return _lookup(standing_clusters(), name, "cluster", STANDING_CLUSTERS_ENV)


def parse_cluster(
    text: str, where: str = "cluster", error: type[SpecError] = SpecError
) -> dict[str, list[str]]:
    """Parse and check a standing cluster spec: JSON with `worker` and `ps` lists of host:port."""
    try:
        jobs = json.loads(text)
    except json.JSONDecodeError as failure:
        raise error(f"{where} is not valid JSON: {failure}") from None
    if not isinstance(jobs, dict) or not jobs.get("worker") or not jobs.get("ps"):
        raise error(
            f'{where} must be a JSON object like {{"worker": ["host:port"], "ps": ["host:port"]}}'
        )
    for job, addresses in jobs.items():
        if job not in ("worker", "ps"):
            raise error(f"{where}: unknown job {job!r}; allowed: worker, ps")
        for address in addresses if isinstance(addresses, list) else [addresses]:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                raise error(f"{where}: {job} address {address!r} is not host:port")
    return {job: list(addresses) for job, addresses in jobs.items()}


def _named(variable: str, names_only: bool = False) -> dict[str, object]:
    """The JSON object of `$variable` (empty when unset), its names checked.

    With `names_only`, a JSON list of names is the object mapping each to null.
    """
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return {}
    try:
        named = json.loads(raw)
    except json.JSONDecodeError as failure:
        raise ClusterConfigError(f"${variable} is not valid JSON: {failure}") from None
    if names_only and isinstance(named, list) and all(isinstance(name, str) for name in named):
        named = dict.fromkeys(named)
    if not isinstance(named, dict):
        expected = ' or a list of names ["name", ...]' if names_only else ""
        raise ClusterConfigError(f'${variable} must be a JSON object {{"name": ...}}{expected}')
    for name in named:
        if not _NAME.fullmatch(name):
            raise ClusterConfigError(
                f"${variable}: cluster name {name!r:.80} must be 1-63 letters, digits, '_', "
                "'.' or '-', starting with a letter or digit"
            )
    return named


def _lookup(clusters: Mapping[str, _Target], name: str, field: str, variable: str) -> _Target:
    if name in clusters:
        return clusters[name]
    allowed = ", ".join(sorted(clusters)) or f"none: this deployment sets no ${variable}"
    raise SpecError(f"{field} {name!r:.80} is not a cluster of this deployment; allowed: {allowed}")
