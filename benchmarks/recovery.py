"""`make bench`'s recovery figures on the local launcher: worker 1 of a two-worker cluster is
SIGKILLed mid-run, with and without warm spares (`stratoflow.distributed.spares`).

Each run is the training task's body (`stratoflow.tasks.train.train`) in a thread of this
process: mnist, 3 epochs, the run's default `max_restarts`. The kill comes once the first
checkpoint exists and, with warm spares, once every spare the cluster keeps has imported
TensorFlow (what a spare is for: a loss late in a long run). The figure is the run's
`recovery_seconds`: from the loss to training again (the restarted cluster's first step, or the
rejoined parameter-server worker up). Run alone: `python -m benchmarks.recovery` prints JSON (its
last line), `python -m benchmarks.run recovery` too, with the load.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

logger = logging.getLogger("benchmarks.recovery")

EPOCHS = 3
REPEATS = 2
CASES = {
    "multi_worker_mirrored": {"strategy": "multi_worker_mirrored", "workers": 2},
    "parameter_server": {"strategy": "parameter_server", "workers": 2, "ps": 1},
}
# How many spares each cluster keeps (`stratoflow.distributed.spares.wanted_for`).
SPARES_KEPT = {"multi_worker_mirrored": 2, "parameter_server": 1}


class _Said(logging.Handler):
    """The launcher's log lines, read from its logger (how the bench knows a spare is warm)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def one_run(case: str, warm_spares: bool) -> dict[str, Any]:
    """Train `case` with worker 1 killed once; its recovery figures."""
    from stratoflow.config import locations
    from stratoflow.tasks import prepare, train
    from stratoflow.tasks.run_context import AirflowRun
    from stratoflow.tracking import mlflow_runs

    said = _Said()
    distributed = logging.getLogger("stratoflow.distributed")
    distributed.addHandler(said)
    distributed.setLevel(logging.INFO)
    run = AirflowRun("retrain_mnist", f"bench__{uuid.uuid4().hex[:8]}")
    conf = {**CASES[case], "epochs": EPOCHS, "warm_spares": warm_spares}
    prepared = prepare.prepare("mnist", conf, run)
    checkpoint = locations.run_dir(run.dag_id, run.run_id) / "checkpoints" / "checkpoint"
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(trained=train.train(run, prepared)))
    started = time.monotonic()
    thread.start()
    warm_wanted = SPARES_KEPT[case] if warm_spares else 0
    while not checkpoint.exists() or _warm(said.lines) < warm_wanted:
        if not thread.is_alive():
            raise RuntimeError(f"{case}: the run ended before the kill")
        time.sleep(0.05)
    victim = _worker_1()
    killed_after = time.monotonic() - started
    victim.kill()
    thread.join()
    distributed.removeHandler(said)
    trained = outcome["trained"]
    client = mlflow_runs.client()
    recoveries = client.get_metric_history(trained.mlflow_run_id, "recovery_seconds")
    return {
        "recovery_seconds": [metric.value for metric in recoveries],
        "killed_after_seconds": killed_after,
        "task_seconds": time.monotonic() - started,
        "final_val_accuracy": trained.final_epoch.get("val_accuracy"),
    }


def _warm(lines: list[str]) -> int:
    return sum(line.startswith("warm spare ready") for line in lines)


def _worker_1() -> Any:
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            config = json.loads(child.environ().get("TF_CONFIG") or "{}")
        except (psutil.Error, json.JSONDecodeError):
            continue
        if config.get("task") == {"type": "worker", "index": 1}:
            return child
    raise RuntimeError("worker 1 is not running")


def measure() -> dict[str, Any]:
    """Every case with and without warm spares, in turns, `REPEATS` times; medians."""
    figures: dict[str, Any] = {"load_average_before": os.getloadavg(), "runs": {}}
    for case in CASES:
        for _ in range(REPEATS):
            for warm_spares in (False, True):
                key = f"{case}/{'warm spares' if warm_spares else 'no spares'}"
                logger.info("%s: worker 1 killed", key)
                figures["runs"].setdefault(key, []).append(one_run(case, warm_spares))
    figures["median_recovery_seconds"] = {
        key: statistics.median(value for run in runs for value in run["recovery_seconds"])
        for key, runs in figures["runs"].items()
    }
    figures["load_average_after"] = os.getloadavg()
    return figures


if __name__ == "__main__":
    from benchmarks.throwaway import use_throwaway_state

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    use_throwaway_state()
    sys.stdout.write(json.dumps(measure()) + "\n")  # one line, the last: the logs may go to stdout
