"""Entry point of a training process: `python -m stratoflow.training.worker PAYLOAD RESULT`.

Started by a launcher (`stratoflow.distributed.protocol`); the payload (`TrainingPayload`) carries
the run's plan, the dataset reference and the run folder. Devices are configured before
TensorFlow runs any op. The chief reports each epoch's metrics and samples of its host to the
task (`protocol.report`), which logs them into MLflow: no process that runs pipeline code holds
MLflow's client or its service account.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratoflow.distributed import lean_tensorflow
from stratoflow.distributed.protocol import TrainingPayload, child_main


def import_ahead() -> None:
    """Import what `main` imports, TensorFlow first and lean: a warm spare
    (`stratoflow.distributed.spares`) does it before it becomes a training process. Imports
    only: TensorFlow's runtime starts later, once `main` has configured the devices."""
    lean_tensorflow.import_tensorflow()
    import psutil  # noqa: F401

    import stratoflow.data.datasets
    import stratoflow.tracking.environment
    import stratoflow.training.host_samples
    import stratoflow.training.progress
    import stratoflow.training.recorded_outputs
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
    from stratoflow.distributed.protocol import EPOCH_REPORT, SYSTEM_REPORT, report
    from stratoflow.tracking import environment
    from stratoflow.training import host_samples, recorded_outputs, trainer
    from stratoflow.training.progress import EpochProgress

    run_dir = Path(payload.run_dir)
    chief = this_process_is_chief()
    on_epoch_end: list[Callable[[Any], None]] = []
    sampling: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if chief:  # only the chief reports
        # A retried attempt may have checkpointed epochs whose metrics never reached MLflow: the
        # task logs each epoch once, whatever it is sent.
        for saved in trainer.read_history(run_dir):
            report(EPOCH_REPORT, saved)
        on_epoch_end = [
            EpochProgress(spec.training.epochs),
            lambda metrics: report(EPOCH_REPORT, metrics.to_dict()),
        ]
        sampling = host_samples.sampled(
            payload.system_metrics_seconds, lambda sample: report(SYSTEM_REPORT, sample)
        )
    dataset = DatasetRef.from_dict(payload.dataset)
    with sampling:
        result = trainer.train(
            spec,
            dataset,
            run_dir,
            on_epoch_end=_all_of(on_epoch_end) if on_epoch_end else None,
        )
    if chief:
        # The later tasks score, log and serve-check the model from what is recorded here,
        # without TensorFlow or the pipeline's code in their processes.
        recorded = recorded_outputs.record(spec, dataset, result.model_path, run_dir)
        result = dataclasses.replace(
            result,
            environment=environment.describe(result.to_dict()),
            test_outputs_path=str(recorded),
        )
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
