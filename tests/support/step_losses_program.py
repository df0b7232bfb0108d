"""One multi-worker process that trains each run it is given and records per-step losses.

`python -m tests.support.step_losses_program PAYLOAD RESULT`, started by the launcher as every
member of a multi_worker_mirrored cluster (see
tests/unit/stratoflow/training/test_strategies_equivalence.py). A process can make a multi-worker
strategy only once, so one launch covers every model and seed: the strategy is made once and
handed to `stratoflow.training.trainer.train` for each run.

Payload: `record_steps` and `runs`, a list of `{"pipeline", "dataset", "config", "run_dir"}`.
Result: `{"runs": [...]}`, one `{"step_losses", "model_path", "num_replicas", "num_workers"}`
per run.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(payload_path: str, result_path: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    payload = json.loads(Path(payload_path).read_text())

    from stratoflow.config.spec import parse_spec
    from stratoflow.training.strategies import (
        configure_host_devices,
        make_strategy,
        required_logical_cpus,
    )

    specs = [parse_spec(run["pipeline"], run["config"]) for run in payload["runs"]]
    configure_host_devices(required_logical_cpus(specs[0].training))
    strategy = make_strategy(specs[0].training)  # before any other TensorFlow op

    from stratoflow.data.datasets import DatasetRef
    from stratoflow.distributed.protocol import READY_MARKER
    from stratoflow.training.trainer import train

    sys.stdout.write(READY_MARKER + "\n")
    sys.stdout.flush()
    results = []
    for spec, run in zip(specs, payload["runs"], strict=True):
        trained = train(
            spec,
            DatasetRef.from_dict(run["dataset"]),
            Path(run["run_dir"]),
            strategy=strategy,
            record_steps=payload["record_steps"],
        )
        results.append(
            {
                "step_losses": trained.step_losses,
                "model_path": trained.model_path,
                "num_replicas": trained.num_replicas,
                "num_workers": trained.num_workers,
            }
        )
    Path(result_path).write_text(json.dumps({"runs": results}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
