"""Entry point of a training process: `python -m stratoflow.training.worker PAYLOAD RESULT`.

Started by a launcher (`stratoflow.distributed.protocol`); the payload (`TrainingPayload`) carries
the run's plan, the dataset reference, the run folder and the MLflow run to stream per-epoch
metrics into. Devices are configured before
TensorFlow runs any op.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratoflow.config import names
from stratoflow.distributed import lean_tensorflow
from stratoflow.distributed.protocol import TrainingPayload, child_main


def import_ahead() -> None:
    """Import what `main` imports, TensorFlow first and lean: a warm spare
    (`stratoflow.distributed.spares`) does it before it becomes a training process. Imports
    only: TensorFlow's runtime starts later, once `main` has configured the devices."""
    lean_tensorflow.import_tensorflow()
    # What the chief's MLflow calls import when they are first made (any spare may become it).
    import mlflow.entities
    import mlflow.system_metrics.system_metrics_monitor  # noqa: F401

    import stratoflow.data.datasets
    import stratoflow.tracking.environment
    import stratoflow.tracking.mlflow_runs
    import stratoflow.tracking.system_metrics
    import stratoflow.training.progress
    import stratoflow.training.trainer  # noqa: F401


def main(payload_path: str, result_path: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    payload = TrainingPayload.from_json(Path(payload_path).read_text())
    lean_tensorflow.import_tensorflow()  # first, before any module below imports it in full

    from stratoflow.training.strategies import configure_host_devices, required_logical_cpus

    spec = payload.plan.spec
    configure_host_devices(required_logical_cpus(spec.training))

    from stratoflow.data.datasets import DatasetRef
    from stratoflow.distributed.cluster import this_process_is_chief
    from stratoflow.tracking import environment, mlflow_runs, system_metrics
    from stratoflow.training import trainer
    from stratoflow.training.progress import EpochProgress

    run_dir = Path(payload.run_dir)
    tracking_uri, run_id = payload.tracking_uri, payload.mlflow_run_id
    chief = this_process_is_chief()
    on_epoch_end: list[Callable[[Any], None]] = []
    sampling: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if chief:  # only the chief talks to MLflow
        epoch_logger = mlflow_runs.EpochLogger(tracking_uri, run_id)
        # A retried attempt may have checkpointed epochs whose metrics never reached MLflow.
        epoch_logger.log_missing(trainer.read_history(run_dir))
        on_epoch_end = [EpochProgress(spec.training.epochs), epoch_logger]
        sampling = system_metrics.sampled_into(tracking_uri, run_id)
    with sampling:
        result = trainer.train(
            spec,
            DatasetRef.from_dict(payload.dataset),
            run_dir,
            on_epoch_end=_all_of(on_epoch_end) if on_epoch_end else None,
        )
    if chief:
        described = environment.describe(result.to_dict())
        mlflow_runs.client(tracking_uri).log_dict(run_id, described, names.ENVIRONMENT_ARTIFACT)
    Path(result_path).write_text(result.to_json())
    # The process exits next: its last garbage collection need not walk TensorFlow's heap
    # (seconds: docs/BENCHMARKS.md, "Facts").
    gc.freeze()


def _all_of(callbacks: list[Callable[[Any], None]]) -> Callable[[Any], None]:
    def on_epoch_end(metrics: Any) -> None:
        for callback in callbacks:
            callback(metrics)

    return on_epoch_end


if __name__ == "__main__":
    child_main(main, "training")
