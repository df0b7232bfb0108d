"""The training host's samples, logged into the run as `system/<name>` while it trains.

The chief samples its host (`stratoflow.training.host_samples`: CPU, memory, disk, network, with
MLflow's names and units) and reports each sample to the task, which logs it here, so the MLflow
UI's "System metrics" tab shows what each strategy cost the host the chief ran on.
"""

from __future__ import annotations

import os
from typing import Any

# MLflow's default is 10 s: too coarse for runs of a minute. MLflow's own variable
# MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL, set where the task runs, overrides it.
SAMPLING_SECONDS = 2.0
INTERVAL_ENV = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"
PREFIX = "system/"
# The metric whose steps a retried attempt continues from.
STEP_METRIC = PREFIX + "cpu_utilization_percentage"


def sampling_seconds() -> float:
    """How often the chief samples its host: `$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`, else 2."""
    return float(os.environ.get(INTERVAL_ENV) or SAMPLING_SECONDS)


class SystemMetricsLogger:
    """Logs each sample as one step of `system/<name>`; a retried attempt continues the steps."""

    def __init__(self, client: Any, run_id: str):
        self.client, self.run_id = client, run_id
        logged = client.get_metric_history(run_id, STEP_METRIC)
        self.step = max((metric.step for metric in logged), default=-1) + 1

    def __call__(self, sample: dict[str, Any]) -> None:
        """Log `sample` (`HostSampler.sample`: its time, and the metrics by MLflow's names)."""
        from mlflow.entities import Metric

        timestamp = int(float(sample["time"]) * 1000)
        metrics = [
            Metric(PREFIX + name, float(value), timestamp, self.step)
            for name, value in sample["metrics"].items()
        ]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.step += 1
