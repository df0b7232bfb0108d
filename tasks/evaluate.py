"""The retrain DAG's evaluation task: score the test split and decide the gate.

It scores the outputs the training process recorded (`stratoflow.training.recorded_outputs`).

`score_test_split` is shared with the strategy benchmark (`stratoflow.tasks.strategy_benchmark`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from stratoflow.config import names
from stratoflow.data.datasets import DatasetRef
from stratoflow.tasks.prepare import PreparedDataset
from stratoflow.tasks.run_context import AirflowRun, XComResult, freezes_heap
from stratoflow.tasks.train import TrainedModel
from stratoflow.training.evaluation import GateDecision
from stratoflow.training.recorded_outputs import RecordedOutputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation(XComResult):
    """What `evaluate` hands to the registration task (the XCom of `evaluate_model`).

    Attributes:
        mlflow_run_id: the DAG run's MLflow run.
        test_metrics: the test split's metrics (`test_loss`, and `test_accuracy` or `test_mae`
            and `test_rmse`; per-class ones stay in MLflow).
        gate: the gate's decision: its report, one check per gated metric and slice.
    """

    mlflow_run_id: str
    test_metrics: dict[str, float]
    gate: GateDecision

    PRODUCER = names.EVALUATE_TASK


@freezes_heap
def evaluate(run: AirflowRun, prepared: PreparedDataset, trained: TrainedModel) -> Evaluation:
    """Score the model on the test split and its slices, and decide the gate against the current
    champion (its run's test and slice metrics).

    The model's outputs are those the training process recorded
    (`stratoflow.training.recorded_outputs`): this process imports no TensorFlow and runs none
    of the pipeline's code.

    Args:
        run: the DAG run.
        prepared: the first task's result (dataset, the run's plan).
        trained: the training task's result (model, shape, the recorded outputs).
    """
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training import evaluation

    spec = prepared.plan.spec
    mlflow_run_id = trained.mlflow_run_id
    recorded = RecordedOutputs.load(trained.test_outputs_path)
    result = score_test_split(
        prepared.dataset,
        recorded,
        mlflow_run_id,
        title=f"{spec.name}: {spec.training.strategy}, {trained.num_replicas} replica(s)",
    )
    # The per-class metrics stay in MLflow; the XCom carries the split's overall ones.
    metrics = {
        k: v
        for k, v in result.metrics().items()
        if not k.startswith(("test_precision_class_", "test_recall_class_"))
    }
    scores = score_slices(prepared.dataset, recorded, mlflow_run_id)
    found = mlflow_runs.champion_metrics(spec.registered_model)
    champion = evaluation.Champion(*found) if found else None
    decision = evaluation.decide_gate(metrics, spec.evaluation, champion, scores)
    report_gate(mlflow_run_id, decision)
    logger.info(
        "%s; gate %s: %s",
        ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
        "passed" if decision.passed else "failed",
        "; ".join(decision.reasons),
    )
    return Evaluation(mlflow_run_id=mlflow_run_id, test_metrics=metrics, gate=decision)


def score_slices(dataset: DatasetRef, recorded: RecordedOutputs, mlflow_run_id: str) -> list[Any]:
    """Score the gate's slices of the test split and log them (`test_slice/<slice>/<metric>`).

    Returns:
        The `stratoflow.training.evaluation.SliceScore` of every slice, in the gate's order.
    """
    from stratoflow.training import slices

    scores = slices.score_slices(
        recorded.outputs, recorded.targets, dataset.target.task, recorded.slices
    )
    if scores:
        from stratoflow.tracking import mlflow_runs

        mlflow_runs.log_metrics(mlflow_run_id, slices.mlflow_metrics(scores))
    return scores


def report_gate(mlflow_run_id: str, decision: GateDecision) -> None:
    """The gate's verdict on the run: tags, the whole report (JSON) and one row per check (a
    table in the MLflow UI)."""
    from stratoflow.tracking import mlflow_runs

    failed = [check.name for check in decision.failed_checks]
    mlflow_runs.set_tags(
        mlflow_run_id,
        {
            names.GATE_PASSED_TAG: decision.passed,
            names.GATE_REASONS_TAG: _shortened("; ".join(decision.reasons)),
            names.GATE_FAILED_TAG: _shortened("; ".join(failed)),
        },
    )
    mlflow_runs.client().log_dict(mlflow_run_id, decision.to_dict(), names.GATE_REPORT_ARTIFACT)
    rows = decision.checks
    mlflow_runs.log_table(
        mlflow_run_id,
        {
            "check": [f"{row.kind} {row.name}" for row in rows],
            "description": [row.description for row in rows],
            "metric": [row.metric for row in rows],
            "value": [row.value for row in rows],
            "bound": [row.bound for row in rows],
            "champion": [row.champion_value for row in rows],
            "max_regression": [row.max_regression for row in rows],
            "examples": [row.examples for row in rows],
            "passed": [row.passed for row in rows],
            "reason": [row.reason for row in rows],
        },
        names.GATE_TABLE_ARTIFACT,
    )


def _shortened(text: str, limit: int = 4000) -> str:
    """MLflow keeps tag values up to 8,000 characters (5,000 on some stores)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def score_test_split(
    dataset: DatasetRef, recorded: RecordedOutputs, mlflow_run_id: str, title: str
) -> Any:
    """Score the model's recorded outputs on the test split and log the results to
    `mlflow_run_id`.

    Logs the test metrics and `evaluation/test_metrics.json`; for classification the per-class
    table and the confusion matrix figure, for regression the residual plot (titled `title`).

    Returns:
        The `stratoflow.training.evaluation.EvaluationResult`.
    """
    from stratoflow.tracking import mlflow_runs, plots
    from stratoflow.training import evaluation

    result = evaluation.score_outputs(recorded.outputs, recorded.targets, dataset.target.task)
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
