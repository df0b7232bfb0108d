"""The launchers by the name a run gives them (its `launcher` setting, `config.options.LAUNCHERS`).

Each is a `stratoflow.distributed.protocol.Launcher`; adding one is one entry here (and one in
`LAUNCHERS`: a test checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable

from stratoflow.config import clusters
from stratoflow.config.training import TrainingConfig
from stratoflow.distributed.launcher import LocalLauncher
from stratoflow.distributed.protocol import Launcher
from stratoflow.distributed.ray_launcher import RayLauncher


def _ray(training: TrainingConfig) -> Launcher:
    # Looked up by name here: the Ray token goes only to an address the deployment configured.
    return RayLauncher(clusters.ray_address(training.ray_cluster), training.placement)


LAUNCHER_FACTORIES: dict[str, Callable[[TrainingConfig], Launcher]] = {
    "local": lambda training: LocalLauncher(),
    "ray": _ray,
}


def launcher_for(training: TrainingConfig) -> Launcher:
    """The launcher of a run, by its `launcher` setting (already checked against the choices)."""
    return LAUNCHER_FACTORIES[training.launcher](training)
