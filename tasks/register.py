"""The retrain DAG's last task: log the model to MLflow, register a version, maybe promote it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from stratoflow.config import locations, names
from stratoflow.tracking.model_registry import RegistrationResult
from tasks.evaluate import Evaluation
from tasks.prepare import PreparedDataset
from tasks.run_context import AirflowRun, XComResult, freezes_heap
from tasks.train import TrainedModel

logger = logging.getLogger(__name__)


@dataclass
class Registration(RegistrationResult, XComResult):
    """The model version `log_and_register` registered, and the DAG run's MLflow run.

    `to_dict()` (inherited) is the XCom of `log_and_register`: the registered model, version,
    model URI, aliases, whether it was promoted, and `mlflow_run_id`.
    """

    mlflow_run_id: str

    PRODUCER = names.REGISTER_TASK


@freezes_heap
def log_and_register(
    run: AirflowRun, prepared: PreparedDataset, trained: TrainedModel, evaluation: Evaluation
) -> Registration:
    """Log the model to MLflow, register a version (alias challenger), promote if the gate passed.

    `champion` moves only when the gate passed and the run's `promote` setting is true, and no
    person must approve it first (`promotion.approval`; `tasks.approve` then moves it). The run
    succeeded: its MLflow run is finished and its checkpoints removed.
    """
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, model_registry

    spec = prepared.plan.spec
    mlflow_run_id = trained.mlflow_run_id
    features, _ = datasets.load_arrays(prepared.dataset, "test")
    model_uri = model_registry.log_model(
        mlflow_run_id, trained.model_path, features, prepared.dataset.target
    )
    # With `promotion.approval: required`, `champion` waits for a person (`tasks.approve`).
    promote = bool(
        spec.training.promote and evaluation.gate.passed and not spec.promotion.approval_required
    )
    result = model_registry.register(
        spec.registered_model,
        mlflow_run_id,
        model_uri,
        promote=promote,
        tags={
            names.DAG_ID_TAG: run.dag_id,
            names.RUN_ID_TAG: run.run_id,
            "strategy": spec.training.strategy,
            spec.evaluation.metric: f"{evaluation.test_metrics[spec.evaluation.metric]:.4f}",
        },
    )
    mlflow_runs.finish_run(mlflow_run_id)
    # The run succeeded: its checkpoints were only there to resume a retry.
    locations.remove_run_dir(run.dag_id, run.run_id, "checkpoints")
    logger.info(
        "%s version %s, aliases %s", result.registered_model, result.version, result.aliases
    )
    return Registration(**result.to_dict(), mlflow_run_id=mlflow_run_id)
