from __future__ import annotations

import numpy as np
import pytest

from stratoflow.config.evaluation_spec import EvaluationGate, MetricBound, SliceGate, checked_gate
from stratoflow.training.evaluation import (
    Champion,
    SliceScore,
    decide_gate,
    score_logits,
    score_regression,
)


def test_score_logits_counts_per_class():
    labels = np.array([0, 0, 1, 1, 2])
    logits = np.eye(3)[[0, 1, 1, 1, 0]] * 5.0  # one 0 mistaken for 1, the 2 mistaken for 0
    result = score_logits(logits, labels)
    assert result.test_accuracy == pytest.approx(0.6)
    assert result.confusion_matrix == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    by_class = {int(row["class"]): row for row in result.per_class}
    assert by_class[0]["precision"] == pytest.approx(0.5)
    assert by_class[0]["recall"] == pytest.approx(0.5)
    assert by_class[1]["precision"] == pytest.approx(2 / 3)
    assert by_class[1]["recall"] == pytest.approx(1.0)
    assert by_class[2]["recall"] == 0.0 and by_class[2]["precision"] == 0.0
    assert result.metrics()["test_recall_class_1"] == pytest.approx(1.0)


def test_loss_is_the_mean_cross_entropy():
    logits = np.array([[2.0, 0.0], [0.0, 0.0]])
    result = score_logits(logits, np.array([0, 1]))
    expected = (-np.log(np.exp(2) / (np.exp(2) + 1)) - np.log(0.5)) / 2
    assert result.test_loss == pytest.approx(expected)


def checked(gate: EvaluationGate, problem_type: str = "classification") -> EvaluationGate:
    return checked_gate(gate, problem_type, "/p/pipeline.yaml")


GATE = checked(EvaluationGate(min=0.9, max_regression=0.01))


def champion(version: str, **metrics: float) -> Champion:
    return Champion(version, {key.replace("__", "/"): value for key, value in metrics.items()})


def test_gate_passes_without_champion():
    assert decide_gate({"test_accuracy": 0.93}, GATE, None).passed


def test_gate_fails_below_the_minimum():
    decision = decide_gate({"test_accuracy": 0.85}, GATE, None)
    assert not decision.passed
    assert "below the minimum 0.9000" in decision.reasons[0]


def test_gate_tolerates_a_small_regression_against_the_champion():
    assert decide_gate({"test_accuracy": 0.945}, GATE, champion("3", test_accuracy=0.95)).passed


def test_gate_fails_a_larger_regression_against_the_champion():
    decision = decide_gate({"test_accuracy": 0.93}, GATE, champion("3", test_accuracy=0.95))
    assert not decision.passed
    assert decision.champion_version == "3" and decision.champion_value == 0.95
    assert "below champion version 3" in decision.reasons[0]


MAE_GATE = checked(EvaluationGate(metric="test_mae", max=45.0, max_regression=2.0), "regression")


def test_a_max_gate_fails_above_its_bound_and_past_the_champion_upwards():
    assert decide_gate({"test_mae": 44.0}, MAE_GATE, None).passed
    above = decide_gate({"test_mae": 46.0}, MAE_GATE, None)
    assert not above.passed and "test_mae 46.0000 is above the maximum 45.0000" in above.reasons[0]
    assert decide_gate({"test_mae": 41.5}, MAE_GATE, champion("2", test_mae=40.0)).passed
    worse = decide_gate({"test_mae": 42.5}, MAE_GATE, champion("2", test_mae=40.0))
    assert not worse.passed and "more than 2.0000 above champion version 2" in worse.reasons[0]


TWO_METRICS = checked(
    EvaluationGate(
        metrics=[
            MetricBound("test_accuracy", min=0.9, max_regression=0.02),
            MetricBound("test_loss", max=0.5, max_regression=0.05),
        ],
        slices=SliceGate(max_regression=0.1, min_examples=5),
    )
)


def test_every_metric_is_gated_and_the_report_says_which_failed():
    metrics = {"test_accuracy": 0.95, "test_loss": 0.31}
    decision = decide_gate(metrics, TWO_METRICS, champion("4", test_accuracy=0.95, test_loss=0.2))
    assert not decision.passed
    assert [check.name for check in decision.failed_checks] == ["test_loss"]
    assert decision.reasons == [
        "test_loss 0.3100 is more than 0.0500 above champion version 4 (0.2000)"
    ]
    assert [(c.kind, c.name, c.passed) for c in decision.checks] == [
        ("metric", "test_accuracy", True),
        ("metric", "test_loss", False),
    ]


def slice_score(name: str, accuracy: float, examples: int = 20) -> SliceScore:
    return SliceScore(name, f"class {name[-1]}", examples, 0.1, {"accuracy": accuracy})


def test_a_slice_more_than_its_bound_below_the_champions_fails_the_gate_naming_it():
    metrics = {"test_accuracy": 0.93, "test_loss": 0.3}
    best = champion(
        "7",
        test_accuracy=0.94,
        test_loss=0.3,
        test_slice__class_0__accuracy=0.95,
        test_slice__class_3__accuracy=0.95,
    )
    scores = [slice_score("class_0", 0.9), slice_score("class_3", 0.5)]
    decision = decide_gate(metrics, TWO_METRICS, best, scores)
    assert not decision.passed
    assert decision.reasons == [
        "slice class_3 (class 3, 20 examples): accuracy 0.5000 is more than 0.1000 below "
        "champion version 7 (0.9500)"
    ]
    (failed,) = decision.failed_checks
    assert (failed.kind, failed.name, failed.champion_value, failed.examples) == (
        "slice",
        "class_3",
        0.95,
        20,
    )
    # The report is a typed object that survives JSON (XCom, the approval step, MLflow).
    assert decision.to_dict()["checks"][3]["name"] == "class_3"


def test_a_small_slice_is_reported_not_gated_and_a_slice_the_champion_lacks_passes():
    metrics = {"test_accuracy": 0.93, "test_loss": 0.3}
    best = champion("7", test_accuracy=0.94, test_loss=0.3, test_slice__class_0__accuracy=1.0)
    decision = decide_gate(
        metrics,
        TWO_METRICS,
        best,
        [slice_score("class_0", 0.0, examples=3), slice_score("new", 0.2)],
    )
    assert decision.passed, decision.reasons
    small, new = decision.checks[2:]
    assert not small.gated and "fewer than min_examples 5" in small.reason
    assert new.gated and new.champion_value is None


def test_regression_scores_are_mse_mae_and_rmse():
    result = score_regression(np.array([[1.0], [3.0], [5.0]]), np.array([2.0, 3.0, 3.0]))
    assert result.test_loss == pytest.approx(5 / 3)
    assert result.metrics() == {
        "test_loss": pytest.approx(5 / 3),
        "test_mae": pytest.approx(1.0),
        "test_rmse": pytest.approx((5 / 3) ** 0.5),
    }
    assert result.predictions == [1.0, 3.0, 5.0] and result.targets == [2.0, 3.0, 3.0]
