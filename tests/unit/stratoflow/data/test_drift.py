"""The drift distances on known distributions, and on statistics of two kinds."""

from __future__ import annotations

import math

import pytest

from stratoflow.data import drift
from stratoflow.data.statistics import FeatureStatistics


def test_psi_and_js_are_zero_for_equal_distributions_and_grow_with_the_shift() -> None:
    same = [0.25, 0.25, 0.5]
    assert drift.psi(same, same) == 0.0
    assert drift.jensen_shannon(same, same) == 0.0
    assert drift.psi([0.5, 0.5], [0.4, 0.6]) == pytest.approx(
        -0.1 * math.log(0.4 / 0.5) + 0.1 * math.log(0.6 / 0.5)
    )
    assert drift.psi([0.5, 0.5], [0.4, 0.6]) < drift.psi([0.5, 0.5], [0.1, 0.9])
    # Disjoint supports: the Jensen-Shannon distance reaches its maximum, 1.
    assert drift.jensen_shannon([1.0, 0.0], [0.0, 1.0]) == pytest.approx(1.0)


def numeric(quantiles: list[float]) -> FeatureStatistics:
    return FeatureStatistics("x", "numeric", count=101, quantiles=tuple(quantiles))


def test_a_numeric_feature_shifted_past_the_champions_range_drifts_fully() -> None:
    before = numeric([float(i) for i in range(101)])
    after = numeric([float(i) + 1000.0 for i in range(101)])

    reference, new = drift.binned(before, after)  # type: ignore[misc]
    assert new[-1] == 1.0 and sum(new) == pytest.approx(1.0)
    assert sum(reference) == pytest.approx(1.0)
    assert drift.distance("psi", before, after) > 2.0
    assert drift.distance("psi", before, before) == 0.0


def test_features_that_cannot_be_compared_have_no_distance() -> None:
    categorical = FeatureStatistics("x", "categorical", 2, vocabulary=("a",), frequencies=(2,))
    other_values = FeatureStatistics("x", "categorical", 2, vocabulary=("b",), frequencies=(2,))

    assert drift.distance("psi", numeric([0.0] * 101), categorical) is None
    assert drift.distance("js", categorical, other_values) is None
