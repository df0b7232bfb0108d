"""Slices of the test split: which examples each holds, their metrics, and the first task's check
of feature slices against the dataset's columns."""

from __future__ import annotations

import numpy as np
import pytest

from stratoflow.config.evaluation_spec import FeatureSlice, SliceGate
from stratoflow.config.features import Column, Features, Target
from stratoflow.config.parsing import SpecError
from stratoflow.training import slices

PENGUINS = Features(
    "tabular",
    columns=(
        Column("island", "categorical", ("Biscoe", "Dream", "Torgersen")),
        Column("body_mass_g", "numeric"),
    ),
)
SPECIES = Target("classification", class_names=("Adelie", "Chinstrap", "Gentoo"))


def test_per_class_and_feature_slices_hold_the_right_examples():
    gate = SliceGate(
        metric="accuracy",
        max_regression=0.1,
        per_class=True,
        features=[
            FeatureSlice("island"),
            FeatureSlice("island", value="Dream", name="dream_only", max_regression=0.3),
            FeatureSlice("body_mass_g", min=4000, max=5000),
            FeatureSlice("body_mass_g", max=4000),
        ],
    )
    raw = {
        "island": np.array([0, 1, 2, 1, 0]),
        "body_mass_g": np.array([3500.0, 4000.0, 4999.0, 5000.0, 6000.0], dtype="float32"),
    }
    targets = np.array([0, 1, 2, 1, 0])
    built = slices.build_slices(gate, raw, targets, PENGUINS, SPECIES)
    by_name = {item.name: item for item in built}
    assert list(by_name) == [
        "class_0",
        "class_1",
        "class_2",
        "island_Biscoe",
        "island_Dream",
        "island_Torgersen",
        "dream_only",
        "body_mass_g_4000_to_5000",
        "body_mass_g_below_4000",
    ]
    assert by_name["class_1"].description == "class 1 (Chinstrap)"
    assert by_name["class_1"].mask.tolist() == [False, True, False, True, False]
    assert by_name["island_Dream"].mask.tolist() == [False, True, False, True, False]
    assert by_name["dream_only"].max_regression == 0.3
    assert by_name["island_Dream"].max_regression == 0.1
    # A range is [min, max): 4000 in, 5000 out.
    assert by_name["body_mass_g_4000_to_5000"].mask.tolist() == [False, True, True, False, False]
    assert by_name["body_mass_g_4000_to_5000"].description == "body_mass_g in [4000, 5000)"
    assert by_name["body_mass_g_below_4000"].mask.tolist() == [True, False, False, False, False]


def test_a_slice_is_scored_on_its_own_examples_and_logged_under_its_name():
    logits = np.eye(3)[[0, 0, 2, 1]] * 5.0  # the first class-1 example is taken for class 0
    targets = np.array([0, 1, 2, 1])
    built = slices.build_slices(SliceGate(per_class=True), {}, targets, Features("image"), SPECIES)
    scores = slices.score_slices(logits, targets, "classification", built)
    by_name = {score.name: score for score in scores}
    assert by_name["class_1"].examples == 2
    assert by_name["class_1"].metrics["accuracy"] == pytest.approx(0.5)  # its recall
    assert by_name["class_0"].metrics["accuracy"] == 1.0
    metrics = slices.mlflow_metrics(scores)
    assert metrics["test_slice/class_1/accuracy"] == pytest.approx(0.5)
    assert metrics["test_slice/class_1/examples"] == 2.0
    assert "test_slice/class_1/loss" in metrics


def test_a_regression_slice_has_its_own_mae():
    gate = SliceGate(metric="mae", features=[FeatureSlice("bmi", min=0.0, name="high")])
    features = Features("tabular", columns=(Column("bmi", "numeric"),))
    raw = {"bmi": np.array([-1.0, 1.0, 2.0])}
    targets = np.array([10.0, 20.0, 30.0])
    built = slices.build_slices(gate, raw, targets, features, Target("regression"))
    (score,) = slices.score_slices(np.array([[10.0], [22.0], [34.0]]), targets, "regression", built)
    assert (score.name, score.examples) == ("high", 2)
    assert score.metrics["mae"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("item", "features", "message"),
    [
        (
            FeatureSlice("beak"),
            PENGUINS,
            r"\.feature 'beak' is not a column of the "
            r"dataset; columns: island, body_mass_g",
        ),
        (FeatureSlice("island", min=1), PENGUINS, "island is categorical; slice it by value"),
        (
            FeatureSlice("island", value="Mars"),
            PENGUINS,
            r"value 'Mars' is not a value of island; "
            r"values: Biscoe, Dream, Torgersen",
        ),
        (FeatureSlice("island", value=7), PENGUINS, r"value 7 is not an id of island; ids: 0-2"),
        (FeatureSlice("body_mass_g"), PENGUINS, "body_mass_g is numeric; slice it by min"),
        (FeatureSlice("pixels", min=0), Features("image", shape=(8, 8, 1)), "need tabular data"),
    ],
)
def test_the_first_task_refuses_a_feature_slice_the_dataset_cannot_have(item, features, message):
    with pytest.raises(
        SpecError, match=rf"^/p/pipeline.yaml: evaluation\.slices\.features\[0\].*{message}"
    ):
        slices.check_feature_slices(SliceGate(features=[item]), features, "/p/pipeline.yaml")
