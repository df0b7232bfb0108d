"""The evaluation gate's spelling in `pipeline.yaml`: several metrics, slices, the single-metric
shorthand, and each mistake refused naming the field."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from stratoflow.config.evaluation_spec import FeatureSlice, MetricBound, SliceGate
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import RunPlan
from stratoflow.config.spec import SPECS_DIR, load_spec, parse_spec

SOURCE = "/p/pipeline.yaml"


def spec_with(pipeline: str, evaluation: object):
    data = yaml.safe_load((SPECS_DIR / pipeline / "pipeline.yaml").read_text())
    data = copy.deepcopy(data)
    data["evaluation"] = evaluation
    return parse_spec(pipeline, data, source=SOURCE)


def test_several_metrics_and_slices_are_read_and_the_first_metric_is_the_primary_one():
    gate = spec_with(
        "penguins",
        {
            "metrics": [
                {"metric": "test_accuracy", "min": 0.9, "max_regression": 0.03},
                {"metric": "test_loss", "max": 0.4, "max_regression": 0.1},
            ],
            "slices": {
                "max_regression": 0.15,
                "features": [{"feature": "island"}, {"feature": "body_mass_g", "min": 4000}],
            },
        },
    ).evaluation
    assert gate.metrics == [
        MetricBound("test_accuracy", min=0.9, max_regression=0.03),
        MetricBound("test_loss", max=0.4, max_regression=0.1),
    ]
    assert (gate.metric, gate.min, gate.max_regression, gate.higher_is_better) == (
        "test_accuracy",
        0.9,
        0.03,
        True,
    )
    assert gate.slices == SliceGate(
        metric="accuracy",
        max_regression=0.15,
        min_examples=20,
        per_class=True,  # classification's default
        features=[FeatureSlice("island"), FeatureSlice("body_mass_g", min=4000.0)],
    )


def test_the_single_metric_shorthand_is_the_list_of_one_with_per_class_slices_by_default():
    gate = spec_with("digits", {"metric": "test_accuracy", "min": 0.9, "max_regression": 0.02})
    assert gate.evaluation.metrics == [MetricBound("test_accuracy", min=0.9, max_regression=0.02)]
    assert gate.evaluation.slices is not None and gate.evaluation.slices.per_class
    older = spec_with("digits", {"min_accuracy": 0.8}).evaluation
    assert older.metrics == [MetricBound("test_accuracy", min=0.8)]
    regression = spec_with("diabetes", {"metric": "test_mae", "max": 50.0}).evaluation
    assert regression.slices == SliceGate(metric="mae", per_class=False)


def test_a_metric_in_the_list_may_be_gated_only_against_the_champion():
    gate = spec_with(
        "digits",
        {
            "metrics": [
                {"metric": "test_accuracy", "min": 0.9},
                {"metric": "test_loss", "max_regression": 0.1},
            ]
        },
    ).evaluation
    assert gate.metrics[1].bound is None and not gate.metrics[1].higher_is_better


def test_the_checked_gate_travels_in_the_run_plan_unchanged():
    spec = spec_with(
        "penguins",
        {
            "metrics": [{"metric": "test_accuracy", "min": 0.9}],
            "slices": {"features": [{"feature": "sex", "value": "female", "name": "female"}]},
        },
    )
    plan = RunPlan.of(spec)
    assert RunPlan.from_dict(json.loads(json.dumps(plan.to_dict()))).spec.evaluation == (
        spec.evaluation
    )


@pytest.mark.parametrize("pipeline", ["mnist", "penguins", "diabetes"])
def test_a_checked_spec_read_back_is_the_same_spec(pipeline):
    """A checked gate's shorthand mirrors its first metric; parsing the checked spec again (as a
    training program given the spec's dict does) keeps it and refuses nothing."""
    import dataclasses

    spec = load_spec(pipeline)
    data = json.loads(json.dumps(dataclasses.asdict(spec)))
    again = parse_spec(spec.name, {key: value for key, value in data.items() if key != "name"})
    assert again.evaluation == spec.evaluation


@pytest.mark.parametrize(
    ("pipeline", "evaluation", "message"),
    [
        (
            "digits",
            {"metrics": [{"metric": "test_loss", "min": 0.1}]},
            r"evaluation\.metrics\[0\]: test_loss is better lower; give max, not min",
        ),
        (
            "digits",
            {"metric": "test_loss", "max": 1.0, "metrics": [{"metric": "test_accuracy"}]},
            r"evaluation: give either metrics \(a list\) or metric with min or max, not both",
        ),
        (
            "digits",
            {"metrics": [{"metric": "test_mae", "max": 1.0}]},
            r"evaluation\.metrics\[0\]\.metric 'test_mae' is not a metric of task "
            r"'classification'; allowed: test_accuracy, test_loss",
        ),
        (
            "digits",
            {"metrics": [{"metric": "test_accuracy", "min": 0.9}, {"metric": "test_accuracy"}]},
            r"evaluation\.metrics: each metric at most once",
        ),
        (
            "digits",
            {"metrics": [{"metric": "test_accuracy", "min": 1.5}]},
            r"evaluation\.metrics\[0\]\.min must be within \[0, 1\]",
        ),
        (
            "digits",
            {"metric": "test_accuracy", "min": 0.9, "slices": {"metric": "mae"}},
            r"evaluation\.slices\.metric 'mae' is not a slice metric of task 'classification'; "
            r"allowed: accuracy, loss",
        ),
        (
            "diabetes",
            {"metric": "test_mae", "max": 50.0, "slices": {"per_class": True}},
            r"evaluation\.slices\.per_class applies only to task classification",
        ),
        (
            "penguins",
            {
                "min_accuracy": 0.9,
                "slices": {"features": [{"feature": "sex", "value": 1, "min": 0}]},
            },
            r"evaluation\.slices\.features\[0\]: give value \(a categorical value\) or min/max",
        ),
        (
            "penguins",
            {"min_accuracy": 0.9, "slices": {"features": [{"feature": "x", "name": "a b"}]}},
            r"evaluation\.slices\.features\[0\]\.name 'a b': use letters, digits",
        ),
        (
            "penguins",
            {"min_accuracy": 0.9, "slices": {"max_regression": -0.1}},
            r"evaluation\.slices\.max_regression must be >= 0",
        ),
        (
            "penguins",
            {"min_accuracy": 0.9, "slices": {"features": [{"feature": "x", "min": 2, "max": 1}]}},
            r"evaluation\.slices\.features\[0\]: min must be below max",
        ),
    ],
)
def test_a_mistake_in_the_gate_is_refused_naming_the_file_and_the_field(
    pipeline: str, evaluation: object, message: str
):
    with pytest.raises(SpecError, match=f"^{SOURCE}: {message}"):
        spec_with(pipeline, evaluation)


def test_every_bundled_pipeline_gates_several_metrics_and_slices():
    for pipeline in ("mnist", "digits", "penguins", "diabetes"):
        gate = load_spec(pipeline).evaluation
        assert len(gate.metrics) >= 2, pipeline
        assert gate.slices is not None
        if load_spec(pipeline).task == "classification":
            assert gate.slices.per_class, pipeline
        else:
            assert gate.slices.features, pipeline
