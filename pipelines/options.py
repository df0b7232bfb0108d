"""The choices a run can make: strategies and training loops.

This module is the single list the DAG's Param dropdowns, the config validation and the strategy
factory (`tasks.strategies`) all read. Adding a strategy means one entry here and one builder in
`tasks.strategies`; the DAG picks it up without change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyTraits:
    """What the orchestration needs to know about a strategy before TensorFlow starts."""

    description: str
    supports_fit: bool
    uses_replicas: bool = False


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
}

LOOPS: dict[str, str] = {
    "custom": "stratoflow's own loop (strategy.run + compute_average_loss); every strategy",
    "fit": "Keras model.fit; only strategies Keras 3 supports",
}

REPLICA_CHOICES = (1, 2, 4, 8)


def strategies_supporting_fit() -> list[str]:
    return [name for name, traits in STRATEGIES.items() if traits.supports_fit]
