"""The deployment's named training clusters: where a run may train outside the task's own host.

Where training runs is the deployment's decision, not a trigger's: a run names a cluster
(`TrainingConfig.cluster`, `TrainingConfig.ray_cluster`) and only a name this module knows is
accepted (the Params are enums of these names, so Airflow refuses anything else at trigger
time). The addresses stay here, in the environment of the deployment's own processes, and are
looked up by name at the moment a task connects: the Ray token and the MLflow account a cluster's
members receive are only ever presented to an address the deployment configured.

- `STRATOFLOW_RAY_CLUSTERS`: a JSON object, name → the Ray cluster's address (`host:port` of
  its head's GCS, `ray://host:port` for Ray Client, or `auto` on a Ray node).
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
from typing import TypeVar

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


def ray_clusters() -> dict[str, str]:
    """The deployment's Ray clusters: name → address, from `$STRATOFLOW_RAY_CLUSTERS`.

    Raises:
        ClusterConfigError: the variable is not a JSON object of names to addresses.
    """
    named = _named(RAY_CLUSTERS_ENV)
    legacy = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    if legacy and DEFAULT not in named:
        named[DEFAULT] = legacy
    for name, address in named.items():
        if not isinstance(address, str) or not (address == "auto" or _HOST_PORT.fullmatch(address)):
            raise ClusterConfigError(
                f"${RAY_CLUSTERS_ENV}: cluster {name!r} has address {address!r:.80}; expected "
                "'host:port' of the Ray head, 'ray://host:port' or 'auto'"
            )
    return {name: str(address) for name, address in named.items()}


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


def ray_address(name: str) -> str:
    """The address of the deployment's Ray cluster `name`.

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


def _named(variable: str) -> dict[str, object]:
    """The JSON object of `$variable` (empty when unset), its names checked."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return {}
    try:
        named = json.loads(raw)
    except json.JSONDecodeError as failure:
        raise ClusterConfigError(f"${variable} is not valid JSON: {failure}") from None
    if not isinstance(named, dict):
        raise ClusterConfigError(f'${variable} must be a JSON object {{"name": ...}}')
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
