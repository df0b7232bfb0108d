"""The `validation:` section: defaults, per-feature bounds, and mistakes named at parse time."""

from __future__ import annotations

import pytest

from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import load_spec, parse_spec
from stratoflow.config.validation import ValidationSpec

MINIMAL = {
    "description": "d",
    "dataset": {"name": "stratoflow_digits"},
    "model": {"builder": "mlp"},
    "training": {},
    "evaluation": {"metric": "test_accuracy", "min": 0.5},
    "registered_model": "m",
}


def test_a_spec_without_the_section_gets_the_default_gate() -> None:
    validation = parse_spec("p", MINIMAL).validation

    assert validation == ValidationSpec()
    assert validation.drift_bound("anything") == 0.25  # psi's default
    assert ValidationSpec(distance="js").drift_bound("x") == 0.1
    assert validation.missing_bound("x") == 0.05
    assert validation.range_of("x") == (None, None)


def test_per_feature_bounds_override_the_defaults() -> None:
    validation = ValidationSpec(
        max_drift=0.3, drift={"label": 0.5}, missing={"sex": 0.2}, ranges={"x": {"min": 1}}
    )

    assert (validation.drift_bound("label"), validation.drift_bound("x")) == (0.5, 0.3)
    assert validation.missing_bound("sex") == 0.2
    assert validation.range_of("x") == (1.0, None)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"distance": "kl"}, "validation.distance 'kl' is not allowed; allowed: psi"),
        ({"max_drift": 0}, "validation.max_drift: expected a number above 0"),
        ({"missing": {"sex": 1.5}}, "validation.missing.sex: expected a share within [0, 1]"),
        ({"ranges": {"x": {"low": 1}}}, "validation.ranges.x: expected a mapping with min"),
        ({"ranges": {"x": {"min": 2, "max": 1}}}, "validation.ranges.x: min 2 is above max 1"),
        ({"treshold": 1}, "validation: unknown key 'treshold'"),
    ],
)
def test_a_mistake_is_refused_naming_the_field(section, message) -> None:
    with pytest.raises(SpecError, match="^pipeline.yaml") as error:
        parse_spec("p", {**MINIMAL, "validation": section}, source="pipeline.yaml")
    assert message in str(error.value)


@pytest.mark.parametrize("pipeline", ["mnist", "digits", "penguins", "diabetes"])
def test_every_bundled_pipeline_declares_its_data_gate(pipeline: str) -> None:
    validation = load_spec(pipeline).validation

    assert validation.distance == "psi" and validation.max_drift == 0.25
    assert validation.ranges, "a bundled pipeline declares the ranges its data must keep"
