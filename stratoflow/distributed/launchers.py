"""The launchers by the name a run gives them (its `launcher` setting, `config.options.LAUNCHERS`).

Each is a `stratoflow.distributed.protocol.Launcher`; adding one is one entry here (and one in
`LAUNCHERS`: a test checks the two agree).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stratoflow.config import clusters, connections
from stratoflow.config.training import TrainingConfig
from stratoflow.distributed.launcher import LocalLauncher
from stratoflow.distributed.protocol import Launcher
from stratoflow.distributed.ray_launcher import RayLauncher

logger = logging.getLogger(__name__)


def _ray(training: TrainingConfig, lookup: connections.Lookup) -> Launcher:
    # Looked up by name here: the Ray token goes only to an address the deployment configured.
    target = clusters.ray_target(training.ray_cluster, lookup)
    logger.info(
        "Ray cluster %r at %s (from %s)", training.ray_cluster, target.address, target.source
    )
    return RayLauncher(target.address, training.placement, target.token)


LAUNCHER_FACTORIES: dict[str, Callable[[TrainingConfig, connections.Lookup], Launcher]] = {
    "local": lambda training, lookup: LocalLauncher(),
    "ray": _ray,
}


def launcher_for(
    training: TrainingConfig, lookup: connections.Lookup = connections.no_connections
) -> Launcher:
    """The launcher of a run, by its `launcher` setting (already checked against the choices).

    `lookup` finds the deployment's Airflow Connections (a Ray cluster's may hold its address).
    """
    return LAUNCHER_FACTORIES[training.launcher](training, lookup)
