"""One readable log line per epoch, written as the epoch ends (it reaches the Airflow task log).

    epoch 3/10: loss 0.1234, accuracy 0.9612, val_loss 0.1410, val_accuracy 0.9550,
    4,210 examples/s, ETA 0:00:35

The training process logs to its stdout, one flushed line per record; the launcher streams that
output line by line into the task's log.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


def format_epoch_line(metrics: Any, epochs: int, eta_seconds: float) -> str:
    """The progress line of one epoch.

    Args:
        metrics: the epoch's `stratoflow.training.trainer.EpochMetrics` (or any object with its
        fields).
        epochs: the run's total number of epochs.
        eta_seconds: the estimated time until the last epoch ends.
    """
    eta = datetime.timedelta(seconds=round(max(eta_seconds, 0.0)))
    name = getattr(metrics, "metric_name", "accuracy")
    return (
        f"epoch {metrics.epoch}/{epochs}: loss {metrics.loss:.4f}, "
        f"{name} {metrics.metric:.4f}, val_loss {metrics.val_loss:.4f}, "
        f"val_{name} {metrics.val_metric:.4f}, {metrics.examples_per_second:,.0f} examples/s, "
        f"ETA {eta}"
    )


class EpochProgress:
    """An `on_epoch_end` callback logging `format_epoch_line` with an ETA from the epochs so far.

    An epoch's duration is the wall time since the previous epoch ended (training, validation,
    checkpoint and logging); the first one seen has only its training time to go by.
    """

    def __init__(self, epochs: int, clock: Any = time.perf_counter):
        self.epochs = epochs
        self.clock = clock
        self.durations: list[float] = []
        self.last_end: float | None = None

    def __call__(self, metrics: Any) -> None:
        now = self.clock()
        self.durations.append(now - self.last_end if self.last_end is not None else metrics.seconds)
        self.last_end = now
        mean = sum(self.durations) / len(self.durations)
        logger.info(format_epoch_line(metrics, self.epochs, mean * (self.epochs - metrics.epoch)))
