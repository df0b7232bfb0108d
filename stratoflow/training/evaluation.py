"""Evaluation: test-split metrics and the quality gate that decides promotion.

The gate is decided here, before anything is registered (TFX's "blessing"): each of the spec's
gate metrics (e.g. `test_accuracy` and `test_loss`) must reach its bound and be no worse than the
current champion's by more than its tolerance, and each gated slice of the test split (a class,
a feature's value or range: `stratoflow.training.slices`) no worse than the same slice of the
champion by more than the slice's tolerance. The decision is a typed report (`GateDecision`):
one `GateCheck` per metric and slice, saying which failed and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stratoflow.config import names
from stratoflow.config.evaluation_spec import SLICE_HIGHER_IS_BETTER, EvaluationGate, MetricBound

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
    # The model's raw outputs per test example (logits, or predictions): what slices are scored on.
    outputs: Any = field(default=None, repr=False, compare=False)

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
class GateCheck:
    """One line of the gate's report: a test metric, or one slice's metric, against its bounds.

    Attributes:
        kind: `metric` (a test metric of the whole split) or `slice`.
        name: the test metric (`test_accuracy`), or the slice (`class_3`, `island_Biscoe`).
        description: what it is, for people (`class 3 (Chinstrap)`).
        metric: the metric compared (`test_accuracy`; a slice's `accuracy`, `mae`, ...).
        value: this model's value.
        higher_is_better: the metric's direction.
        passed: whether this check let the model through.
        bound: the `min` or `max` it must reach (None: only compared with the champion).
        max_regression: how much worse than the champion's it may be.
        champion_value: the champion's value (None: no champion, or it has no such value).
        examples: test examples in the slice (None for a metric of the whole split).
        gated: False for a slice too small to gate (`min_examples`): reported only.
        reason: why it failed, or what it found (empty when it simply passed).
    """

    kind: str
    name: str
    description: str
    metric: str
    value: float | None
    higher_is_better: bool
    passed: bool
    bound: float | None = None
    max_regression: float | None = None
    champion_value: float | None = None
    examples: int | None = None
    gated: bool = True
    reason: str = ""


@dataclass
class GateDecision:
    """The gate's report (the XCom's `gate`; also `evaluation/gate.json` on the run).

    Attributes:
        passed: every check passed.
        reasons: why it failed, one line per failed check (`["passed"]` when it passed).
        champion_version: the champion it was compared with, if any.
        champion_value: the champion's value of the primary (first) metric.
        checks: one line per gated metric and slice, failed or not.
    """

    passed: bool
    reasons: list[str] = field(default_factory=list)
    champion_version: str | None = None
    champion_value: float | None = None
    checks: list[GateCheck] = field(default_factory=list)

    @property
    def failed_checks(self) -> list[GateCheck]:
        """The checks that failed."""
        return [check for check in self.checks if not check.passed]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SliceScore:
    """One slice's metrics on the test split (`stratoflow.training.slices.score_slices`).

    Attributes:
        name: the slice (`class_3`), as in its MLflow metrics (`names.slice_metric`).
        description: what it is, for people.
        examples: its test examples.
        max_regression: how far below the champion's value it may fall.
        metrics: its metrics (e.g. accuracy and loss, or mae), without the `test_` prefix.
    """

    name: str
    description: str
    examples: int
    max_regression: float
    metrics: dict[str, float]


@dataclass(frozen=True)
class Champion:
    """The current champion: its version and the metrics of the run that made it."""

    version: str
    metrics: dict[str, float]


def predict_outputs(model_path: str, features: Any) -> np.ndarray:
    """The saved Keras model's outputs (logits, or predictions) on `features`, as evaluated."""
    import keras

    model = keras.models.load_model(model_path)
    return np.asarray(model.predict(features, batch_size=EVAL_BATCH_SIZE, verbose=0))


def evaluate_model(
    model_path: str, features: Any, targets: np.ndarray, problem_type: str = "classification"
) -> EvaluationResult:
    """Score the saved Keras model on the test split's arrays (`datasets.load_arrays`)."""
    return score_outputs(predict_outputs(model_path, features), targets, problem_type)


def score_outputs(
    outputs: np.ndarray, targets: np.ndarray, problem_type: str = "classification"
) -> EvaluationResult:
    """Score a model's outputs (logits, or predictions) against the targets."""
    if problem_type == "regression":
        result = score_regression(outputs, targets)
    else:
        result = score_logits(outputs, targets)
    result.outputs = outputs
    return result


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
    metrics: dict[str, float],
    gate: EvaluationGate,
    champion: Champion | None,
    slices: Sequence[SliceScore] = (),
) -> GateDecision:
    """Pass if every gated metric reaches its bound and is not worse than the champion's by more
    than its `max_regression`, and no gated slice is worse than the champion's same slice by more
    than its own.

    Args:
        metrics: this model's test metrics.
        gate: the spec's checked gate.
        champion: the current champion (its run's metrics), or None.
        slices: this model's slice scores (`slices.score_slices`).
    """
    checks = [_metric_check(bound, metrics, champion) for bound in gate.metrics]
    if gate.slices is not None:
        checks += [
            _slice_check(score, gate.slices.metric or "", gate.slices.min_examples, champion)
            for score in slices
        ]
    failed = [check.reason for check in checks if not check.passed]
    primary = gate.metrics[0].metric if gate.metrics else gate.metric
    return GateDecision(
        passed=not failed,
        reasons=failed or ["passed"],
        champion_version=champion.version if champion else None,
        champion_value=champion.metrics.get(primary) if champion else None,
        checks=checks,
    )


def _metric_check(
    bound: MetricBound, metrics: dict[str, float], champion: Champion | None
) -> GateCheck:
    name, value, higher = bound.metric, metrics[bound.metric], bound.higher_is_better
    check = GateCheck(
        kind="metric",
        name=name,
        description=name,
        metric=name,
        value=value,
        higher_is_better=higher,
        passed=True,
        bound=bound.bound,
        max_regression=bound.max_regression,
    )
    problems = []
    if bound.bound is not None and ((value < bound.bound) if higher else (value > bound.bound)):
        problems.append(
            f"{name} {value:.4f} is {'below the minimum' if higher else 'above the maximum'} "
            f"{bound.bound:.4f}"
        )
    if champion is not None and name in champion.metrics:
        check.champion_value = champion.metrics[name]
        problem = _regression(name, value, higher, bound.max_regression, champion, name)
        if problem:
            problems.append(problem)
    check.passed = not problems
    check.reason = "; ".join(problems)
    return check


def _slice_check(
    score: SliceScore, metric: str, min_examples: int, champion: Champion | None
) -> GateCheck:
    higher = SLICE_HIGHER_IS_BETTER[metric]
    value = score.metrics.get(metric)
    check = GateCheck(
        kind="slice",
        name=score.name,
        description=score.description,
        metric=metric,
        value=value,
        higher_is_better=higher,
        passed=True,
        max_regression=score.max_regression,
        examples=score.examples,
    )
    key = names.slice_metric(score.name, metric)
    if champion is not None and key in champion.metrics:
        check.champion_value = champion.metrics[key]
    if score.examples < min_examples or value is None:
        check.gated = False
        check.reason = (
            f"not gated: {score.examples} test example(s), fewer than min_examples {min_examples}"
        )
        return check
    if champion is None or check.champion_value is None:
        return check
    what = f"slice {score.name} ({score.description}, {score.examples} examples): {metric}"
    problem = _regression(what, value, higher, score.max_regression, champion, key)
    if problem:
        check.passed = False
        check.reason = problem
    return check


def _regression(
    what: str, value: float, higher: bool, allowed: float, champion: Champion, key: str
) -> str:
    """Why `value` is worse than the champion's `key` by more than `allowed`, or ""."""
    reference = champion.metrics[key]
    limit = reference - allowed if higher else reference + allowed
    if (value < limit) if higher else (value > limit):
        return (
            f"{what} {value:.4f} is more than {allowed:.4f} {'below' if higher else 'above'} "
            f"champion version {champion.version} ({reference:.4f})"
        )
    return ""
