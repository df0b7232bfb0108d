"""CPU, memory, disk and network of the training host, sampled into the run while it trains.

MLflow's `SystemMetricsMonitor` (needs `psutil`) logs `system/cpu_utilization_percentage`,
`system/system_memory_usage_megabytes`, ... to a run id, without the fluent `start_run`. The
training process (the chief only) runs it around training, so the MLflow UI's "System metrics"
tab shows what each strategy cost the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

# MLflow's default is 10 s: too coarse for runs of a minute. The MLflow variable
# MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it.
SAMPLING_SECONDS = 2.0
INTERVAL_ENV = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"


@contextlib.contextmanager
def sampled_into(tracking_uri: str, run_id: str) -> Iterator[None]:
    """Sample system metrics into run `run_id` while the block runs.

    A retried attempt continues the run's `system/...` steps. When the block ends, the samples
    taken since the last logged point are logged too, so a run shorter than one interval still
    gets its point. Monitoring failures are logged, never raised: they must not fail training.
    """
    monitor: Any = None
    try:
        import psutil
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        psutil.cpu_percent()  # the first reading is 0.0: take it here, not in the first sample
        interval = float(os.environ.get(INTERVAL_ENV) or SAMPLING_SECONDS)
        monitor = SystemMetricsMonitor(
            run_id, sampling_interval=interval, resume_logging=True, tracking_uri=tracking_uri
        )
        monitor.start()
    except Exception:
        logger.warning("system metrics will not be logged", exc_info=True)
        monitor = None
    try:
        yield
    finally:
        if monitor is not None:
            _finish(monitor)


def _finish(monitor: Any) -> None:
    try:
        monitor.finish()
        # The monitor drops the samples of its last, unfinished interval: log them.
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception:
        logger.warning("could not log the last system metrics sample", exc_info=True)
