"""The retrain DAG's evaluation task: score the test split and decide the gate.

`score_test_split` is shared with the strategy benchmark (`tasks.strategy_benchmark`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from stratoflow.config import names
from stratoflow.data.datasets import DatasetRef
from stratoflow.training.evaluation import GateDecision
from tasks.prepare import PreparedDataset
from tasks.run_context import AirflowRun, XComResult, freezes_heap
from tasks.train import TrainedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation(XComResult):
    """What `evaluate` hands to the registration task (the XCom of `evaluate_model`).

    Attributes:
        mlflow_run_id: the DAG run's MLflow run.
        test_metrics: the test split's metrics (`test_loss`, and `test_accuracy` or `test_mae`
            and `test_rmse`; per-class ones stay in MLflow).
        gate: the gate's decision.
    """

    mlflow_run_id: str
    test_metrics: dict[str, float]
    gate: GateDecision

    PRODUCER = names.EVALUATE_TASK


@freezes_heap
def evaluate(run: AirflowRun, prepared: PreparedDataset, trained: TrainedModel) -> Evaluation:
    """Score the model on the test split and decide the gate against the current champion.

    Args:
        run: the DAG run.
        prepared: the first task's result (dataset, the run's plan).
        trained: the training task's result (model, shape).
    """
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training import evaluation

    spec = prepared.plan.spec
    mlflow_run_id = trained.mlflow_run_id
    result = score_test_split(
        prepared.dataset,
        trained.model_path,
        mlflow_run_id,
        title=f"{spec.name}: {spec.training.strategy}, {trained.num_replicas} replica(s)",
    )
    # The per-class metrics stay in MLflow; the XCom carries the split's overall ones.
    metrics = {
        k: v
        for k, v in result.metrics().items()
        if not k.startswith(("test_precision_class_", "test_recall_class_"))
    }
    gate = spec.evaluation
    decision = evaluation.decide_gate(
        metrics, gate, mlflow_runs.champion(spec.registered_model, gate.metric)
    )
    mlflow_runs.set_tags(
        mlflow_run_id, {"gate.passed": decision.passed, "gate.reasons": "; ".join(decision.reasons)}
    )
    logger.info(
        "%s; gate %s: %s",
        ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
        "passed" if decision.passed else "failed",
        "; ".join(decision.reasons),
    )
    return Evaluation(mlflow_run_id=mlflow_run_id, test_metrics=metrics, gate=decision)


def score_test_split(dataset: DatasetRef, model_path: str, mlflow_run_id: str, title: str) -> Any:
    """Score the saved model on the test split and log the results to `mlflow_run_id`.

    Logs the test metrics and `evaluation/test_metrics.json`; for classification the per-class
    table and the confusion matrix figure, for regression the residual plot (titled `title`).

    Returns:
        The `stratoflow.training.evaluation.EvaluationResult`.
    """
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, plots
    from stratoflow.training import evaluation

    features, targets = datasets.load_arrays(dataset, "test")
    result = evaluation.evaluate_model(model_path, features, targets, dataset.target.task)
    mlflow_runs.log_metrics(mlflow_run_id, result.metrics())
    if dataset.target.task == "regression":
        mlflow_runs.client().log_dict(
            mlflow_run_id, {"metrics": result.metrics()}, names.TEST_METRICS_ARTIFACT
        )
        mlflow_runs.log_figure(
            mlflow_run_id,
            plots.residuals(result.predictions, result.targets, title=title),
            names.RESIDUALS_ARTIFACT,
        )
        return result
    mlflow_runs.client().log_dict(
        mlflow_run_id,
        {"per_class": result.per_class, "confusion_matrix": result.confusion_matrix},
        names.TEST_METRICS_ARTIFACT,
    )
    class_names = list(dataset.class_names)
    mlflow_runs.log_figure(
        mlflow_run_id,
        plots.confusion_matrix(result.confusion_matrix, class_names, title=title),
        names.CONFUSION_MATRIX_ARTIFACT,
    )
    mlflow_runs.log_table(
        mlflow_run_id,
        _per_class_columns(result.per_class, class_names),
        names.PER_CLASS_ARTIFACT,
    )
    return result


def _per_class_columns(
    per_class: list[dict[str, float]], class_names: list[str]
) -> dict[str, list[Any]]:
    """The per-class metrics as table columns: class, name, precision, recall, support."""
    classes = [int(row["class"]) for row in per_class]
    return {
        "class": classes,
        "name": [class_names[k] if k < len(class_names) else str(k) for k in classes],
        "precision": [row["precision"] for row in per_class],
        "recall": [row["recall"] for row in per_class],
        "support": [int(row["support"]) for row in per_class],
    }
