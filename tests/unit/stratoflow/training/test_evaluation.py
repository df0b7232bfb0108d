from __future__ import annotations

import numpy as np
import pytest

from stratoflow.config.spec import EvaluationGate
from stratoflow.training.evaluation import decide_gate, score_logits, score_regression


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


GATE = EvaluationGate(min=0.9, max_regression=0.01)


def test_gate_passes_without_champion():
    assert decide_gate({"test_accuracy": 0.93}, GATE, None).passed


def test_gate_fails_below_the_minimum():
    decision = decide_gate({"test_accuracy": 0.85}, GATE, None)
    assert not decision.passed
    assert "below the minimum 0.9000" in decision.reasons[0]


def test_gate_tolerates_a_small_regression_against_the_champion():
    assert decide_gate({"test_accuracy": 0.945}, GATE, ("3", 0.95)).passed


def test_gate_fails_a_larger_regression_against_the_champion():
    decision = decide_gate({"test_accuracy": 0.93}, GATE, ("3", 0.95))
    assert not decision.passed
    assert decision.champion_version == "3"
    assert "below champion version 3" in decision.reasons[0]


MAE_GATE = EvaluationGate(metric="test_mae", max=45.0, max_regression=2.0)


def test_a_max_gate_fails_above_its_bound_and_past_the_champion_upwards():
    assert decide_gate({"test_mae": 44.0}, MAE_GATE, None).passed
    above = decide_gate({"test_mae": 46.0}, MAE_GATE, None)
    assert not above.passed and "test_mae 46.0000 is above the maximum 45.0000" in above.reasons[0]
    assert decide_gate({"test_mae": 41.5}, MAE_GATE, ("2", 40.0)).passed
    worse = decide_gate({"test_mae": 42.5}, MAE_GATE, ("2", 40.0))
    assert not worse.passed and "more than 2.0000 above champion version 2" in worse.reasons[0]


def test_regression_scores_are_mse_mae_and_rmse():
    result = score_regression(np.array([[1.0], [3.0], [5.0]]), np.array([2.0, 3.0, 3.0]))
    assert result.test_loss == pytest.approx(5 / 3)
    assert result.metrics() == {
        "test_loss": pytest.approx(5 / 3),
        "test_mae": pytest.approx(1.0),
        "test_rmse": pytest.approx((5 / 3) ** 0.5),
    }
    assert result.predictions == [1.0, 3.0, 5.0] and result.targets == [2.0, 3.0, 3.0]
