"""The retrain DAG's last task: log the model to MLflow, register a version, maybe promote it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from stratoflow.config import locations, names
from stratoflow.tasks.evaluate import Evaluation
from stratoflow.tasks.prepare import PreparedDataset
from stratoflow.tasks.run_context import AirflowRun, XComResult, freezes_heap
from stratoflow.tasks.train import TrainedModel
from stratoflow.tracking.model_registry import RegistrationResult
from stratoflow.tracking.serving_check import FreshProcess, ServingCheck
from stratoflow.training.recorded_outputs import RecordedOutputs

logger = logging.getLogger(__name__)


@dataclass
class Registration(RegistrationResult, XComResult):
    """The model version `log_and_register` registered, and the DAG run's MLflow run.

    `to_dict()` (inherited) is the XCom of `log_and_register`: the registered model, version,
    model URI, aliases, whether it was promoted, and `mlflow_run_id`.
    """

    mlflow_run_id: str
    # The serving check's verdict (`passed: ...` / `failed: <why>`); empty where none ran.
    serving_check: str = ""

    PRODUCER = names.REGISTER_TASK


@freezes_heap
def log_and_register(
    run: AirflowRun, prepared: PreparedDataset, trained: TrainedModel, evaluation: Evaluation
) -> Registration:
    """Log the model to MLflow, register a version (alias challenger), promote if the gate passed
    and the version serves.

    `champion` moves only when the gate passed, the run's `promote` setting is true, the
    registered version, loaded in a fresh process the way it will be served, answers the test
    examples as the evaluated model did (`check_serving`), and no person must approve it first
    (`promotion.approval`: `stratoflow.tasks.approve` then moves it, and is skipped when the check
    failed); otherwise the version keeps only `challenger`. The run succeeded: its MLflow run is
    finished and its checkpoints removed.
    """
    from stratoflow.tracking import serving_check

    spec = prepared.plan.spec
    serves = spec.training.promote and evaluation.gate.passed
    # The serving check's fresh process starts first and imports while this process logs and
    # registers the version (its imports are most of the check's seconds).
    fresh = serving_check.start_fresh_process(*serving_environment()) if serves else None
    try:
        return _log_and_register(run, prepared, trained, evaluation, fresh)
    finally:
        if fresh is not None:
            fresh.close()


def _log_and_register(
    run: AirflowRun,
    prepared: PreparedDataset,
    trained: TrainedModel,
    evaluation: Evaluation,
    fresh: FreshProcess | None,
) -> Registration:
    from stratoflow.tracking import mlflow_runs, model_registry

    spec = prepared.plan.spec
    mlflow_run_id = trained.mlflow_run_id
    # What the training process recorded stands in for the model: this process loads none.
    recorded = RecordedOutputs.load(trained.test_outputs_path)
    model_uri = model_registry.log_model(
        mlflow_run_id, trained.model_path, recorded, prepared.dataset.target
    )
    # Registered as challenger first; champion moves only once the version served in a fresh
    # process answered as the evaluated model did (and, where the pipeline asks, a person
    # approved: `stratoflow.tasks.approve`).
    result = model_registry.register(
        spec.registered_model,
        mlflow_run_id,
        model_uri,
        promote=False,
        tags={
            names.DAG_ID_TAG: run.dag_id,
            names.RUN_ID_TAG: run.run_id,
            "strategy": spec.training.strategy,
            spec.evaluation.metric: f"{evaluation.test_metrics[spec.evaluation.metric]:.4f}",
            # The data gate of a later run compares its data with these.
            names.STATISTICS_VERSION_TAG: f"runs:/{mlflow_run_id}/{names.STATISTICS_ARTIFACT}",
        },
    )
    serving = ""
    if fresh is not None:  # the run may promote and the gate passed
        check = check_serving(
            prepared, trained, recorded, result.registered_model, result.version, fresh
        )
        serving = check.tag
        if not check.passed:  # an earlier try of this run may have promoted it
            result.aliases = model_registry.withdraw_champion(
                result.registered_model, result.version
            )
        elif not spec.promotion.approval_required:
            result.aliases = model_registry.promote(result.registered_model, result.version)
            result.promoted = True
    mlflow_runs.finish_run(mlflow_run_id)
    # The run succeeded: its checkpoints were only there to resume a retry.
    locations.remove_run_dir(run.dag_id, run.run_id, "checkpoints")
    logger.info(
        "%s version %s, aliases %s", result.registered_model, result.version, result.aliases
    )
    return Registration(**result.to_dict(), mlflow_run_id=mlflow_run_id, serving_check=serving)


def serving_environment() -> tuple[dict[str, str], Any]:
    """The serving check's fresh process's environment and `preexec_fn`: the pipeline
    environment (no Airflow or Ray secret), no MLflow account either (it loads a local copy of
    the version), and death with this process."""
    import os
    import signal

    from stratoflow.distributed import member_environment, processes

    environment = {
        name: value
        for name, value in member_environment.pipeline_environment(os.environ).items()
        if not name.startswith("MLFLOW_TRACKING_")
    }
    return environment, processes.die_with_parent(signal.SIGKILL)


def check_serving(
    prepared: PreparedDataset,
    trained: TrainedModel,
    recorded: RecordedOutputs,
    registered_model: str,
    version: str,
    fresh: FreshProcess | None = None,
) -> ServingCheck:
    """Serve the registered version in a fresh process and compare its answers with the
    evaluated model's on the first test examples (`stratoflow.tracking.serving_check`).

    `recorded` holds those examples and the evaluated model's outputs on them
    (`stratoflow.training.recorded_outputs.RecordedOutputs`); `fresh`, the fresh process if it
    was started ahead (`serving_check.start_fresh_process`). The verdict is a tag on the
    version and on the run (`stratoflow.serving_check`: `passed: ...` or `failed: <why>`), and
    its duration the run's metric `serving_check_seconds`.

    Returns:
        The check's verdict.
    """
    from stratoflow.tracking import mlflow_runs, serving_check

    # The fresh process runs the model's code: `serving_environment`.
    environment, preexec_fn = serving_environment()
    check = serving_check.check_served_answers(
        f"models:/{registered_model}/{version}",
        recorded.examples,
        recorded.example_outputs(),
        prepared.dataset.target,
        environment,
        preexec_fn=preexec_fn,
        fresh=fresh,
    )
    mlflow_client = mlflow_runs.client()
    mlflow_client.set_model_version_tag(
        registered_model, version, names.SERVING_CHECK_TAG, check.tag
    )
    mlflow_runs.set_tags(trained.mlflow_run_id, {names.SERVING_CHECK_TAG: check.tag})
    mlflow_runs.log_metrics(
        trained.mlflow_run_id, {names.SERVING_CHECK_SECONDS_METRIC: check.seconds}
    )
    log = logger.info if check.passed else logger.warning
    log(
        "serving check of %s version %s %s in %.1f s: %s",
        registered_model,
        version,
        "passed" if check.passed else "failed (champion stays where it was)",
        check.seconds,
        check.reason,
    )
    return check
