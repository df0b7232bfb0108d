"""What the statistics of every split cost against training, on the bundled datasets.

`python -m benchmarks.statistics_cost [PIPELINE ...]` (default: mnist, digits, penguins,
diabetes) prepares each pipeline's dataset, computes the statistics of every split as the first
task does (`stratoflow.data.profiling.dataset_statistics`, one streamed pass), then trains the
pipeline with its spec's defaults under one_device (`stratoflow.training.trainer.train`), and
prints one JSON line per pipeline: both wall times and their ratio, with the host's load average
(a shared machine's figures move with it). Not a timed test: a figure for the docs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PIPELINES = ("mnist", "digits", "penguins", "diabetes")


def measure(pipeline: str) -> dict[str, object]:
    from stratoflow.config.spec import load_spec
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.data.profiling import dataset_statistics
    from stratoflow.training.trainer import train

    spec = load_spec(pipeline)
    spec = dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, strategy="one_device")
    )
    dataset = prepare_dataset(spec.dataset, folder=spec.folder or None, problem_type=spec.task)
    dataset_statistics(dataset, roles=["validation"])  # warm-up: the first read traces tf.data
    started = time.perf_counter()
    statistics = dataset_statistics(dataset, seed=spec.training.seed)
    statistics_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="stratoflow-bench-") as folder:
        started = time.perf_counter()
        train(spec, dataset, Path(folder))
        train_seconds = time.perf_counter() - started
    return {
        "pipeline": pipeline,
        "examples": sum(split.examples for split in statistics.splits.values()),
        "statistics_seconds": round(statistics_seconds, 3),
        "train_seconds": round(train_seconds, 2),
        "epochs": spec.training.epochs,
        "share_of_training": round(statistics_seconds / train_seconds, 4),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main(pipelines: list[str]) -> None:
    from stratoflow.distributed import lean_tensorflow

    lean_tensorflow.import_tensorflow()
    for pipeline in pipelines or PIPELINES:
        print(json.dumps(measure(pipeline)), flush=True)  # noqa: T201 (the benchmark's output)


if __name__ == "__main__":
    main(sys.argv[1:])
