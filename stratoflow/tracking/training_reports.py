"""Where a training run's reports go: each epoch's metrics and the chief's host samples, into the
DAG run's MLflow run, from the task process that runs the training.

The training processes run pipeline code, so they hold no MLflow client and no service account;
the chief reports (`stratoflow.distributed.protocol.report`) and the launcher hands each report
here as it reads it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from stratoflow.tracking import mlflow_runs
from stratoflow.tracking.system_metrics import SystemMetricsLogger

logger = logging.getLogger(__name__)


class TrainingReports:
    """Logs a training run's reports into MLflow run `run_id`: `epoch` and `system`.

    Called from the launcher's output readers (a thread per local member), hence the lock. An
    MLflow error is logged, not raised: raised there, it would stop the reading of a member's
    output. The epochs still reach MLflow once: `log_history` logs what is missing at the end.
    """

    def __init__(self, tracking_uri: str, run_id: str):
        self.epochs = mlflow_runs.EpochLogger(tracking_uri, run_id)
        self.system_metrics = SystemMetricsLogger(self.epochs.client, run_id)
        self.lock = threading.Lock()

    def epoch(self, metrics: dict[str, Any]) -> None:
        """Log one epoch's metrics (step = epoch), unless they are in MLflow already."""
        self._log(self.epochs, metrics, "an epoch's metrics")

    def system(self, sample: dict[str, Any]) -> None:
        """Log one sample of the chief's host (`system/<name>`)."""
        self._log(self.system_metrics, sample, "a sample of the host")

    def _log(self, log_one: Any, data: dict[str, Any], what: str) -> None:
        with self.lock:
            try:
                log_one(data)
            except Exception:
                logger.warning("could not log %s into MLflow", what, exc_info=True)

    def log_history(self, history: Iterable[dict[str, float]]) -> None:
        """Log the epochs of the training result that no report got into MLflow (raises, this
        time, if MLflow refuses)."""
        with self.lock:
            self.epochs.log_missing(history)
