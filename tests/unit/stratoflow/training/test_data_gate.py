"""The data gate on statistics of real prepared data: the penguins, and copies of them with a
renamed column, a class removed, a feature shifted by a constant and 20 % missing values, each
refused against the champion's statistics with the anomaly named, and accepted by accept_drift."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from stratoflow.config.features import Column
from stratoflow.config.spec import load_spec
from stratoflow.config.validation import ValidationSpec
from stratoflow.data.statistics import DatasetStatistics
from stratoflow.training.data_gate import DRIFT, MISSING, RANGE, SCHEMA, check_data, report_html

GENTOO = 2


@pytest.fixture(scope="module")
def penguins(tf_runtime) -> Any:
    from stratoflow.data.datasets import prepare_dataset

    spec = load_spec("penguins")
    return prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)


def statistics_of(
    reference: Any,
    change: Callable[[Any], Any] | None = None,
    rename: tuple[str, str] | None = None,
) -> DatasetStatistics:
    """The statistics of every split of `reference`, each split first changed by `change` (a
    `tf.data` transformation), with one column renamed by `rename` (old, new)."""
    from stratoflow.data.datasets import load_split
    from stratoflow.data.profiling import split_statistics

    features = reference.features
    if rename is not None:
        old, new = rename
        features = dataclasses.replace(
            features,
            columns=tuple(
                Column(new, c.kind, c.vocabulary) if c.name == old else c for c in features.columns
            ),
        )
    splits = {}
    for role in reference.splits:
        split = load_split(reference, role)
        if change is not None:
            split = change(split)
        if rename is not None:
            split = split.map(lambda x, y: ({(new if k == old else k): v for k, v in x.items()}, y))
        batches = split.batch(64).as_numpy_iterator()
        splits[role] = split_statistics(batches, features, reference.target, role)
    return DatasetStatistics("stratoflow_penguins:1.0.0", "changed", "classification", splits)


@pytest.fixture(scope="module")
def champion(penguins) -> DatasetStatistics:
    return statistics_of(penguins)


def without_gentoo(split: Any) -> Any:
    return split.filter(lambda x, y: y != GENTOO)


def bill_depth_plus_3mm(split: Any) -> Any:
    return split.map(lambda x, y: ({**x, "bill_depth_mm": x["bill_depth_mm"] + 3.0}, y))


def every_fifth_bill_length_missing(split: Any) -> Any:
    import tensorflow as tf

    def blank(index: Any, pair: Any) -> Any:
        x, y = pair
        missing = tf.equal(index % 5, 0)
        length = tf.where(missing, tf.constant(float("nan")), x["bill_length_mm"])
        return {**x, "bill_length_mm": length}, y

    return split.enumerate().map(blank)


CASES = {
    "renamed column": (
        {"rename": ("bill_length_mm", "bill_len_mm")},
        SCHEMA,
        "feature 'bill_length_mm' is missing",
    ),
    "class removed": (
        {"change": without_gentoo},
        SCHEMA,
        "class 'Gentoo' has no examples in the training split",
    ),
    "feature shifted": (
        {"change": bill_depth_plus_3mm},
        DRIFT,
        "bill_depth_mm: population stability index",
    ),
    "20% missing": (
        {"change": every_fifth_bill_length_missing},
        MISSING,
        "bill_length_mm in train: 20.",
    ),
}


def test_the_same_data_passes_with_no_drift(penguins, champion) -> None:
    report = check_data(statistics_of(penguins), champion, load_spec("penguins").validation)

    assert report.passed and not report.accepted_drift, report.summary()
    assert report.anomalies == []
    assert {row.feature for row in report.drift} == {
        "island",
        "sex",
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
        "label",
    }
    assert all(row.value == pytest.approx(0.0, abs=1e-12) for row in report.drift)


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_copy_is_refused_naming_the_anomaly(penguins, champion, case: str) -> None:
    changes, check, named = CASES[case]
    report = check_data(
        statistics_of(penguins, **changes), champion, load_spec("penguins").validation
    )

    assert not report.passed
    assert any(a.check == check and named in a.message for a in report.anomalies), [
        a.describe() for a in report.anomalies
    ]
    assert named in report.summary() and "accept_drift=true" in report.summary()
    assert named in report_html(report, "penguins").replace("&#x27;", "'")


@pytest.mark.parametrize("case", list(CASES))
def test_accept_drift_lets_a_broken_copy_through_for_one_run(penguins, champion, case) -> None:
    changes, _, named = CASES[case]
    report = check_data(
        statistics_of(penguins, **changes),
        champion,
        load_spec("penguins").validation,
        accept_drift=True,
    )

    assert report.passed and report.accepted_drift
    assert "accepted by accept_drift" in report.summary() and named in report.summary()


def test_without_a_champion_only_missing_values_and_ranges_are_checked(penguins) -> None:
    validation = load_spec("penguins").validation
    shifted = check_data(statistics_of(penguins, change=bill_depth_plus_3mm), None, validation)
    missing = check_data(
        statistics_of(penguins, change=every_fifth_bill_length_missing), None, validation
    )

    assert shifted.passed and shifted.drift == [] and shifted.champion is None
    assert "no champion statistics to compare with" in shifted.notes[0]
    assert not missing.passed
    assert {a.check for a in missing.anomalies} == {MISSING}


def test_a_value_outside_the_declared_range_is_an_anomaly(penguins) -> None:
    validation = ValidationSpec(ranges={"body_mass_g": {"max": 5000}})
    report = check_data(statistics_of(penguins), None, validation)

    assert not report.passed
    assert {(a.check, a.feature) for a in report.anomalies} == {(RANGE, "body_mass_g")}
    assert "above the declared max 5000" in report.anomalies[0].message


def test_a_per_feature_bound_overrides_the_default(penguins, champion) -> None:
    shifted = statistics_of(penguins, change=bill_depth_plus_3mm)
    loose = ValidationSpec(drift={"bill_depth_mm": 100.0})
    js = ValidationSpec(distance="js")

    assert check_data(shifted, champion, loose).passed
    refused = check_data(shifted, champion, js)
    assert [a.feature for a in refused.anomalies] == ["bill_depth_mm"]
    assert "Jensen-Shannon distance" in refused.anomalies[0].message
