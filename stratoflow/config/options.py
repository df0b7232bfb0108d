"""The choices a run can make besides its strategy: training loops, launchers, placements, counts.

The DAG's Param dropdowns and the config validation read these lists; the strategies are described
in `stratoflow.config.strategies`.
"""

from __future__ import annotations

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
