"""The first task's work on a pipeline's own code, in a child process of its own.

Preparing a pipeline's dataset runs the pipeline's TFDS builder (if it has one), and the check
of its code (`validation.check_pipeline_code`) imports its model builder and preprocessing and
runs them on two examples. Both run here, in one child started like a training member
(`stratoflow.distributed.launcher`): the allowlisted environment of `member_environment` instead
of the task process's (which holds Airflow's secrets and the Ray token), its output streamed into
the task log, and it dies with the task. The task process imports neither the pipeline's code nor
TensorFlow for it.

A refusal (the spec's data or code does not fit) comes back as a `SpecError` naming the pipeline
file and the field, so the DAG fails the task without a retry (`stratoflow/dags/refusals.py`). Any
other failure of the child (an error, a crash, a kill) fails the task with the child's last log
lines, and Airflow's retries apply.

Run as `python -m stratoflow.training.own_code_check PAYLOAD RESULT` by `prepare_and_check`.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratoflow.config.parsing import SpecError

if TYPE_CHECKING:
    from stratoflow.config.run_plan import RunPlan
    from stratoflow.config.spec import PipelineSpec
    from stratoflow.data.datasets import DatasetRef
    from stratoflow.data.statistics import DatasetStatistics

logger = logging.getLogger(__name__)

CHILD_NAME = "own-code check"
MODULE = "stratoflow.training.own_code_check"
# The result key of a refusal (a `SpecError`); `error` stays the launcher's key for a failure.
REFUSAL_KEY = "refusal"


def prepare_and_check(plan: RunPlan) -> tuple[DatasetRef, DatasetStatistics]:
    """Prepare the plan's dataset, compute its statistics and check the pipeline's own code
    against it, in a child process; or recall the result of a passed check of the same code,
    data and configuration (`own_code_cache`), without a child.

    The child gets the plan itself (`RunPlan.to_dict`), not the pipeline's name: it reads no YAML.
    The statistics are computed there because reading a split runs the pipeline's
    `dataset.preprocess`, its own code.

    Returns:
        The prepared dataset's reference, and the statistics of every split.

    Raises:
        SpecError: data that does not fit the spec, or the pipeline's own code (dataset builder,
            model builder, preprocessing, optimizer) refused; naming the pipeline file and field.
        ChildProcessFailed: the child failed otherwise (an error that a retry may change, a
            crash, a kill); the message quotes its last log lines.
    """
    from stratoflow.data.datasets import DatasetRef
    from stratoflow.data.statistics import DatasetStatistics
    from stratoflow.distributed.launcher import run_python_module
    from stratoflow.training import own_code_cache

    key = own_code_cache.cache_key(plan.spec)
    result = own_code_cache.recall(key) if key else None
    if result is not None:
        logger.info(
            "the pipeline's code, data and configuration equal a passed own-code check's: "
            "not checked again (%s)",
            key,
        )
    else:
        result = run_python_module(MODULE, plan.to_dict(), name=CHILD_NAME)
        if REFUSAL_KEY in result:
            raise SpecError(result[REFUSAL_KEY])
        # A dataset this child built had no files to key yet: the next run's check is kept.
        if key:
            kept = {**result, "dataset": {**result["dataset"], "built": False}}
            own_code_cache.remember(key, kept)
    return (
        DatasetRef.from_dict(result["dataset"]),
        DatasetStatistics.from_dict(result["statistics"]),
    )


def prepare_and_check_here(spec: PipelineSpec) -> tuple[DatasetRef, DatasetStatistics]:
    """What the child does, in this process: prepare the dataset, compute its statistics (one
    streamed pass per split), then check the code.

    Raises:
        SpecError: as `prepare_and_check`.
    """
    from stratoflow.data import datasets, profiling
    from stratoflow.training.validation import check_pipeline_code, preprocessing_refusal

    try:
        reference = datasets.prepare_dataset(
            spec.dataset, folder=spec.folder or None, problem_type=spec.task
        )
    except (datasets.DatasetMismatchError, SpecError) as error:
        message = str(error)
        raise SpecError(
            message if spec.source in message else f"{spec.source}: {message}"
        ) from None
    try:
        statistics = profiling.dataset_statistics(reference, seed=spec.training.seed)
    except SpecError as error:  # the preprocessing's import path does not resolve
        raise SpecError(f"{spec.source}: {error}") from None
    except Exception as error:  # reading a split runs the pipeline's preprocessing
        if spec.dataset.preprocess is None:
            raise
        raise preprocessing_refusal(spec, error) from None
    check_pipeline_code(spec, reference, statistics.train)
    return reference, statistics


def main(payload_path: str, result_path: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    from stratoflow.distributed import lean_tensorflow

    lean_tensorflow.import_tensorflow()  # first, before any module below imports it in full
    from stratoflow.config.run_plan import RunPlan

    spec = RunPlan.from_json(Path(payload_path).read_text(), "the own-code check's plan").spec
    result: dict[str, Any]
    try:
        reference, statistics = prepare_and_check_here(spec)
        result = {"dataset": reference.to_dict(), "statistics": statistics.to_dict()}
    except SpecError as error:
        result = {REFUSAL_KEY: str(error)}
    Path(result_path).write_text(json.dumps(result))
    # The process exits next: its last garbage collection need not walk TensorFlow's heap.
    gc.freeze()


if __name__ == "__main__":
    from stratoflow.distributed.protocol import child_main

    # Any error but a refusal: the launcher raises it in the task, which Airflow may retry.
    child_main(main, "the own-code check")
