"""Evaluation: test-split metrics and the quality gate that decides promotion.

The gate is decided here, before anything is registered (TFX's "blessing"): the spec's gate
metric (e.g. `test_accuracy`, `test_mae`) must reach its bound and be no worse than the current
champion's by more than the spec's tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stratoflow.config.spec import EvaluationGate

EVAL_BATCH_SIZE = 256


@dataclass
class EvaluationResult:
    """A model's scores on the test split.

    Classification fills `test_accuracy`, `per_class` and `confusion_matrix`; regression fills
    `test_mae`, `test_rmse` and the `predictions` (and `targets`) the residual plot draws.
    """

    test_loss: float
    test_accuracy: float | None = None
    per_class: list[dict[str, float]] = field(default_factory=list)
    confusion_matrix: list[list[int]] = field(default_factory=list)
    test_mae: float | None = None
    test_rmse: float | None = None
    predictions: list[float] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics: `test_loss`, then `test_accuracy` and per-class precision and
        recall (classification) or `test_mae` and `test_rmse` (regression)."""
        flat = {"test_loss": self.test_loss}
        for name in ("test_accuracy", "test_mae", "test_rmse"):
            value = getattr(self, name)
            if value is not None:
                flat[name] = value
        for row in self.per_class:
            flat[f"test_precision_class_{int(row['class'])}"] = row["precision"]
            flat[f"test_recall_class_{int(row['class'])}"] = row["recall"]
        return flat


@dataclass
class GateDecision:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    champion_version: str | None = None
    champion_value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_model(
    model_path: str, features: Any, targets: np.ndarray, problem_type: str = "classification"
) -> EvaluationResult:
    """Score the saved Keras model on the test split's arrays (`datasets.load_arrays`)."""
    import keras

    model = keras.models.load_model(model_path)
    outputs = np.asarray(model.predict(features, batch_size=EVAL_BATCH_SIZE, verbose=0))
    if problem_type == "regression":
        return score_regression(outputs, targets)
    return score_logits(outputs, targets)


def score_regression(outputs: np.ndarray, targets: np.ndarray) -> EvaluationResult:
    """Mean squared error (the loss), MAE and RMSE of predictions against float targets."""
    predictions = outputs.reshape(len(targets), -1)
    expected = np.asarray(targets, dtype=np.float64).reshape(predictions.shape)
    errors = predictions - expected
    mse = float(np.mean(np.square(errors)))
    return EvaluationResult(
        test_loss=mse,
        test_mae=float(np.mean(np.abs(errors))),
        test_rmse=float(np.sqrt(mse)),
        predictions=predictions[:, 0].astype(float).tolist(),
        targets=expected[:, 0].astype(float).tolist(),
    )


def score_logits(logits: np.ndarray, labels: np.ndarray) -> EvaluationResult:
    """Loss, accuracy, confusion matrix and per-class precision/recall from logits."""
    num_classes = logits.shape[-1]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = float(-log_probabilities[np.arange(len(labels)), labels].mean())
    predictions = logits.argmax(axis=-1)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    per_class = []
    for label in range(num_classes):
        true_positive = confusion[label, label]
        predicted = confusion[:, label].sum()
        actual = confusion[label, :].sum()
        per_class.append(
            {
                "class": float(label),
                "precision": float(true_positive / predicted) if predicted else 0.0,
                "recall": float(true_positive / actual) if actual else 0.0,
                "support": float(actual),
            }
        )
    return EvaluationResult(
        test_loss=loss,
        test_accuracy=float((predictions == labels).mean()),
        per_class=per_class,
        confusion_matrix=confusion.tolist(),
    )


def decide_gate(
    metrics: dict[str, float], gate: EvaluationGate, champion: tuple[str, float] | None
) -> GateDecision:
    """Pass if the gate's metric reaches its bound and is not worse than the champion's by more
    than `max_regression` (higher is better with `min`, lower with `max`)."""
    name = gate.metric
    value = metrics[name]
    decision = GateDecision(passed=True)
    higher = gate.higher_is_better
    if (value < gate.bound) if higher else (value > gate.bound):
        decision.passed = False
        decision.reasons.append(
            f"{name} {value:.4f} is {'below the minimum' if higher else 'above the maximum'} "
            f"{gate.bound:.4f}"
        )
    if champion is not None:
        decision.champion_version, decision.champion_value = champion
        limit = champion[1] - gate.max_regression if higher else champion[1] + gate.max_regression
        if (value < limit) if higher else (value > limit):
            decision.passed = False
            decision.reasons.append(
                f"{name} {value:.4f} is more than {gate.max_regression:.4f} "
                f"{'below' if higher else 'above'} champion version {champion[0]} "
                f"({champion[1]:.4f})"
            )
    if decision.passed:
        decision.reasons.append("passed")
    return decision
