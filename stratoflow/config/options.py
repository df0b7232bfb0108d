"""The choices a run can make: strategies and training loops.

This module is the single list the DAG's Param dropdowns, the config validation and the strategy
factory (`stratoflow.training.strategies`) all read. Adding a strategy means one entry here and one
builder in
`stratoflow.training.strategies`; the DAG picks it up without change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyTraits:
    """What the orchestration needs to know about a strategy before TensorFlow starts."""

    description: str
    supports_fit: bool
    uses_replicas: bool = False
    # Runs as a cluster of processes (`workers` workers, and `ps` parameter servers for PS).
    uses_workers: bool = False
    uses_ps: bool = False


STRATEGIES: dict[str, StrategyTraits] = {
    "auto": StrategyTraits(
        "mirrored over all GPUs if there are several, else one_device", supports_fit=True
    ),
    "one_device": StrategyTraits("one device: the first GPU, else the CPU", supports_fit=True),
    "mirrored": StrategyTraits(
        "synchronous data parallelism on one host: all GPUs, or `replicas` logical CPUs on a "
        "CPU-only host",
        supports_fit=True,
        uses_replicas=True,
    ),
    "tpu": StrategyTraits("TPUStrategy; fails clearly where no TPU is attached", supports_fit=True),
    "multi_worker_mirrored": StrategyTraits(
        "synchronous data parallelism across `workers` processes (one per host in production)",
        supports_fit=False,  # Keras 3 fit fails under MWMS (keras-team/keras#20585)
        uses_workers=True,
    ),
    "parameter_server": StrategyTraits(
        "asynchronous training: `workers` workers and `ps` parameter servers, this task "
        "coordinating",
        supports_fit=False,  # Keras 3 has no ParameterServerStrategy support in fit
        uses_workers=True,
        uses_ps=True,
    ),
    "central_storage": StrategyTraits(
        "variables on the CPU, compute mirrored over `replicas` devices; no random layers",
        supports_fit=False,  # Keras fit reports a wrong loss under CentralStorage
        uses_replicas=True,
    ),
}

LOOPS: dict[str, str] = {
    "custom": "stratoflow's own loop (strategy.run + compute_average_loss); every strategy",
    "fit": "Keras model.fit; only strategies Keras 3 supports",
}

LAUNCHERS: dict[str, str] = {
    "local": "child processes on this task's host (supervised, restarted from checkpoints)",
    "ray": "Ray actors on a standing Ray cluster, reserved as one placement group",
}

# Ray placement-group strategies, by the name a run gives them.
PLACEMENTS: dict[str, str] = {
    "pack": "as few nodes as possible (Ray's PACK)",
    "spread": "across nodes where possible (Ray's SPREAD)",
    "strict_spread": "every member on a node of its own, or the run does not start "
    "(Ray's STRICT_SPREAD)",
}

REPLICA_CHOICES = (1, 2, 4, 8)
WORKER_CHOICES = (1, 2, 3, 4)
PS_CHOICES = (1, 2)


def strategies_supporting_fit() -> list[str]:
    return [name for name, traits in STRATEGIES.items() if traits.supports_fit]
