"""Samples of the training host (CPU, memory, disk, network), taken by the chief while it trains.

The names and units are MLflow's system metrics (`mlflow.system_metrics.metrics`): the task logs
each sample into the run as `system/<name>` (`stratoflow.tracking.system_metrics`), and the MLflow
UI's "System metrics" tab shows them. Only psutil here: the training process imports no MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]


class HostSampler:
    """Takes samples of this host; CPU use and network traffic count from its creation."""

    def __init__(self) -> None:
        import psutil

        psutil.cpu_percent()  # the first reading is 0.0: take it here, not in the first sample
        self.network_at_start = psutil.net_io_counters()

    def sample(self) -> dict[str, Any]:
        """`{"time": seconds since the epoch, "metrics": {name: value}}`."""
        import psutil

        memory = psutil.virtual_memory()
        disk = psutil.disk_usage(os.sep)
        network = psutil.net_io_counters()
        metrics = {
            "cpu_utilization_percentage": psutil.cpu_percent(),
            "system_memory_usage_megabytes": memory.used / 1e6,
            "system_memory_usage_percentage": memory.used / memory.total * 100,
            "disk_usage_percentage": disk.percent,
            "disk_usage_megabytes": disk.used / 1e6,
            "disk_available_megabytes": disk.free / 1e6,
            "network_receive_megabytes": (network.bytes_recv - self.network_at_start.bytes_recv)
            / 1e6,
            "network_transmit_megabytes": (network.bytes_sent - self.network_at_start.bytes_sent)
            / 1e6,
        }
        return {"time": time.time(), "metrics": {k: round(v, 1) for k, v in metrics.items()}}


@contextlib.contextmanager
def sampled(interval_seconds: float, send: Send) -> Iterator[None]:
    """Send a sample of the host every `interval_seconds` while the block runs, and one more as
    it ends (so a block shorter than one interval still gets its point). A failure to sample is
    logged, never raised: it must not fail training."""
    try:
        sampler = HostSampler()
    except Exception:
        logger.warning("system metrics will not be sampled", exc_info=True)
        yield
        return
    stop = threading.Event()

    def send_one() -> None:
        try:
            send(sampler.sample())
        except Exception:
            logger.warning("could not sample the host", exc_info=True)

    def loop() -> None:
        while not stop.wait(interval_seconds):
            send_one()

    thread = threading.Thread(target=loop, name="host-samples", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        send_one()
