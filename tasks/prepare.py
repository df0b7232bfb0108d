"""The retrain DAG's first task: resolve the run's plan, prepare the dataset, open the run's MLflow
run.

The plan (`stratoflow.config.run_plan.RunPlan`) is resolved and validated here, once per DAG run;
it travels to the next tasks inside the `PreparedDataset` (through XCom, under `run_config`), so a
retried task trains and scores with the plan the run started with, whatever its own process sees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratoflow.config import locations, names
from stratoflow.config.run_plan import RunPlan, resolve_plan
from stratoflow.data.datasets import DatasetRef
from stratoflow.data.statistics import STATISTICS_FILE, DatasetStatistics
from stratoflow.tasks.run_context import (
    AirflowRun,
    PayloadError,
    XComResult,
    freezes_heap,
    plan_from_dict,
    typed,
)
from stratoflow.tracking.fingerprints import Fingerprints

logger = logging.getLogger(__name__)

# The XCom key of the run's plan: the resolved spec's keys, and the plan's `cluster`.
RUN_CONFIG_KEY = "run_config"
MLFLOW_RUN_KEY = "mlflow_run_id"


class NothingNew(Exception):  # noqa: N818  (an outcome, not an error)
    """A scheduled run found nothing new since the champion: it skips training; the message says
    why (`stratoflow.tracking.fingerprints.unchanged_since_champion`)."""


@dataclass(frozen=True)
class PreparedDataset(XComResult):
    """What `prepare` hands to every later task of the DAG run (the XCom of `prepare_dataset`).

    Its dict keeps the dataset reference's keys at the top, beside `mlflow_run_id` and
    `run_config`.

    Attributes:
        dataset: the prepared dataset.
        mlflow_run_id: the DAG run's MLflow run.
        plan: the run's plan (its spec with the run's Params applied, its members), validated
            once, here.
    """

    dataset: DatasetRef
    mlflow_run_id: str
    plan: RunPlan

    PRODUCER = names.PREPARE_TASK

    def to_dict(self) -> dict[str, Any]:
        """The dataset reference's keys, `mlflow_run_id` and `run_config` (a JSON dict)."""
        return {
            **self.dataset.to_dict(),
            MLFLOW_RUN_KEY: self.mlflow_run_id,
            RUN_CONFIG_KEY: self.plan.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> PreparedDataset:
        """Rebuild it from `to_dict()` output (the XCom of `prepare_dataset`).

        Raises:
            PayloadError: a key is missing or unknown, or a value is invalid (named).
        """
        what = f"the result of {cls.PRODUCER}"
        if not isinstance(data, dict):
            raise PayloadError(f"{what}: expected a dict, got {type(data).__name__}")
        missing = [key for key in (MLFLOW_RUN_KEY, RUN_CONFIG_KEY) if key not in data]
        if missing:
            raise PayloadError(f"{what} is not a PreparedDataset: missing key {missing[0]!r}")
        reference = {k: v for k, v in data.items() if k not in (MLFLOW_RUN_KEY, RUN_CONFIG_KEY)}
        try:
            dataset = DatasetRef.from_dict(reference)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise PayloadError(f"{what}: its dataset reference is invalid: {error}") from None
        return cls(
            dataset=dataset,
            mlflow_run_id=typed(data[MLFLOW_RUN_KEY], str, MLFLOW_RUN_KEY, what),
            plan=plan_from_dict(data[RUN_CONFIG_KEY], f"{what}: {RUN_CONFIG_KEY}"),
        )


@freezes_heap
def prepare(pipeline: str, params: dict[str, Any], run: AirflowRun) -> PreparedDataset:
    """Resolve the run's plan, build or load the dataset and open the run's MLflow run.

    Args:
        pipeline: the pipeline name.
        params: the DAG run's Params (its overrides of the spec's training defaults).
        run: the DAG run.

    Raises:
        SpecError: invalid Params; data that does not fit the spec (labels vs `task`); the
            pipeline's own code (dataset builder, model builder, preprocessing, optimizer)
            refused; each naming the pipeline file and the field.
        TrackingUnavailableError: MLflow does not answer (checked in seconds, before any work).
        NameOwnedError: another MLflow user owns the pipeline's experiment or registered model
            (checked before any work; a refusal, like a `SpecError`).
        ChildProcessFailed: the child that prepares the dataset and checks the pipeline's code
            failed otherwise (its last log lines quoted); a retry may get past it.
        NothingNew: a scheduled or asset-triggered run, not forced, whose dataset, code and
            configuration equal the champion's; no MLflow run was opened.
    """
    from stratoflow.tracking import mlflow_runs, name_claims

    plan = resolve_plan(pipeline, params)
    spec = plan.spec
    mlflow_runs.check_reachable()
    name_claims.claim_pipeline_names(spec)
    from stratoflow.training import own_code_check

    # The pipeline's dataset builder and code run in a child with the pipeline environment; it
    # also streams every split into its statistics (reading a split runs the preprocessing).
    reference, statistics = own_code_check.prepare_and_check(plan)
    # A run with nothing new stops here (skipped), before it writes anything.
    fingerprints = check_something_new(plan, reference, run)
    write_statistics(statistics, locations.run_dir(run.dag_id, run.run_id))
    mlflow_run_id = mlflow_runs.start_or_resume_run(
        spec,
        run.dag_id,
        run.run_id,
        run.try_number,
        reference.to_dict(),
        triggered_by=run.triggered_by,
    )
    mlflow_runs.set_tags(mlflow_run_id, fingerprints.tags())
    return PreparedDataset(dataset=reference, mlflow_run_id=mlflow_run_id, plan=plan)


def write_statistics(statistics: DatasetStatistics, run_dir: Path) -> Path:
    """Keep the run's statistics in its folder, where the data gate and the training processes
    read them."""
    import json

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / STATISTICS_FILE
    path.write_text(json.dumps(statistics.to_dict()))
    return path


def check_something_new(plan: RunPlan, reference: DatasetRef, run: AirflowRun) -> Fingerprints:
    """The run's fingerprints, after checking that an unattended run has something to train.

    Raises:
        NothingNew: the run is scheduled or asset-triggered, not forced, and its fingerprints
            equal the champion's.
    """
    from stratoflow.tracking import fingerprints

    current = fingerprints.of_run(plan.spec, reference.to_dict())
    unchanged = fingerprints.unchanged_since_champion(plan.spec.registered_model, current)
    if unchanged is None:
        return current
    if fingerprints.may_skip(run.run_type, plan.training.force):
        raise NothingNew(f"{unchanged}; trigger it manually or set force to train anyway")
    why = "forced" if plan.training.force else f"a {run.run_type or 'manual'} run"
    logger.info("%s; training anyway: %s", unchanged, why)
    return current
