"""Evaluation: test-split metrics and the quality gate that decides promotion.

The gate is decided here, before anything is registered (TFX's "blessing"): a model must reach
the spec's minimum accuracy and be no worse than the current champion by more than the spec's
tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stratoflow.config.spec import EvaluationGate

EVAL_BATCH_SIZE = 256


@dataclass
class EvaluationResult:
    test_loss: float
    test_accuracy: float
    per_class: list[dict[str, float]]
    confusion_matrix: list[list[int]]

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics: test loss/accuracy and per-class precision and recall."""
        flat = {"test_loss": self.test_loss, "test_accuracy": self.test_accuracy}
        for row in self.per_class:
            flat[f"test_precision_class_{int(row['class'])}"] = row["precision"]
            flat[f"test_recall_class_{int(row['class'])}"] = row["recall"]
        return flat


@dataclass
class GateDecision:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    champion_version: str | None = None
    champion_accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_model(model_path: str, images: np.ndarray, labels: np.ndarray) -> EvaluationResult:
    """Score the saved Keras model on the test arrays."""
    import keras

    model = keras.models.load_model(model_path)
    logits = model.predict(images, batch_size=EVAL_BATCH_SIZE, verbose=0)
    return score_logits(np.asarray(logits), labels)


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
    test_accuracy: float, gate: EvaluationGate, champion: tuple[str, float] | None
) -> GateDecision:
    """Pass if the accuracy reaches the minimum and does not regress past the champion's."""
    decision = GateDecision(passed=True)
    if test_accuracy < gate.min_accuracy:
        decision.passed = False
        decision.reasons.append(
            f"test_accuracy {test_accuracy:.4f} is below the minimum {gate.min_accuracy:.4f}"
        )
    if champion is not None:
        decision.champion_version, decision.champion_accuracy = champion
        floor = champion[1] - gate.max_regression
        if test_accuracy < floor:
            decision.passed = False
            decision.reasons.append(
                f"test_accuracy {test_accuracy:.4f} is more than {gate.max_regression:.4f} below "
                f"champion version {champion[0]} ({champion[1]:.4f})"
            )
    if decision.passed:
        decision.reasons.append("passed")
    return decision
