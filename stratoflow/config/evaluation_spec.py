"""The evaluation gate of a pipeline spec (`evaluation:` in `pipeline.yaml`), typed and checked.

A gate names one or more test metrics, each with a bound and an allowed regression against the
current champion, and slices of the test split (per class by default for classification, and
slices by a feature's value or range) whose metric may not fall more than its bound below the
champion's for the same slice:

```yaml
evaluation:
  metrics:
    - {metric: test_accuracy, min: 0.9, max_regression: 0.02}
    - {metric: test_loss, max: 0.5, max_regression: 0.1}
  slices:
    max_regression: 0.15      # for every slice without its own
    min_examples: 20          # smaller slices are reported, not gated (the default)
    per_class: true           # classification's default
    features:
      - {feature: island}                      # one slice per value
      - {feature: body_mass_g, min: 4000}      # a range [min, max)
```

The single-metric spelling `metric`, `min` or `max`, `max_regression` (and the older
`min_accuracy`) is still read: it is the list of one metric. Once checked, `metrics` holds every
gated metric and `metric`, `min`, `max`, `max_regression` mirror the first one (the *primary*
metric: the version's tag, the strategy benchmark's threshold).

Light on purpose (no NumPy): DAG files parse specs.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from stratoflow.config.parsing import SpecError

# The test metrics each problem type produces, and whether higher is better; a gate names some
# of its own problem type's.
TEST_METRICS = {
    "classification": ("test_accuracy", "test_loss"),
    "regression": ("test_mae", "test_rmse", "test_loss"),
}
HIGHER_IS_BETTER = {
    "test_accuracy": True,
    "test_loss": False,
    "test_mae": False,
    "test_rmse": False,
}
# What a slice is scored by (the test metric's name without `test_`), and the default.
SLICE_METRICS = {"classification": ("accuracy", "loss"), "regression": ("mae", "rmse", "loss")}
DEFAULT_SLICE_METRIC = {"classification": "accuracy", "regression": "mae"}
SLICE_HIGHER_IS_BETTER = {"accuracy": True, "loss": False, "mae": False, "rmse": False}
# MLflow metric names take letters, digits, `_ - . / : ` and spaces; a slice name is part of one.
_SLICE_NAME = re.compile(r"^[\w.\-:]+$")


@dataclass(frozen=True)
class MetricBound:
    """One gated test metric.

    Attributes:
        metric: a test metric of the pipeline's task (`TEST_METRICS`).
        min: the value it must reach (for a metric where higher is better).
        max: the value it must not exceed (for a metric where lower is better).
        max_regression: how much worse than the champion's value it may be.
    """

    metric: str
    min: float | None = None
    max: float | None = None
    max_regression: float = 0.0

    @property
    def higher_is_better(self) -> bool:
        """True when the bound is a `min` (and for a known metric that is better higher)."""
        if self.min is None and self.max is None:
            return HIGHER_IS_BETTER.get(self.metric, True)
        return self.max is None

    @property
    def bound(self) -> float | None:
        """The `min` or `max`, or None for a metric gated only against the champion."""
        return self.max if self.max is not None else self.min


@dataclass(frozen=True)
class FeatureSlice:
    """The test examples whose feature has one value, or lies in a range `[min, max)`.

    With neither `value` nor `min`/`max`: one slice per value of a categorical feature.
    Values are the dataset's own (before the pipeline's `preprocess`): a categorical value by its
    name in the column's vocabulary or by its integer id, a numeric range in the column's units.

    Attributes:
        feature: a tabular column of the dataset.
        value: a categorical column's value (name or id).
        min: a numeric column's lower end (included).
        max: a numeric column's upper end (excluded).
        name: the slice's name in reports and MLflow metric names (default made from the above).
        max_regression: this slice's own allowed regression (default: the slices' one).
    """

    feature: str
    value: Any = None
    min: float | None = None
    max: float | None = None
    name: str | None = None
    max_regression: float | None = None


@dataclass(frozen=True)
class SliceGate:
    """The slices of the test split the gate compares with the champion's.

    Attributes:
        metric: what each slice is scored by: `accuracy` or `loss` (classification; a class's
            accuracy is its recall), `mae`, `rmse` or `loss` (regression); default by task.
        max_regression: how much worse than the champion's value for the same slice a slice
            may be.
        min_examples: a slice with fewer test examples is reported but not gated (one example
            more or less would move it too far); the default 20 keeps a slice's one example
            within 0.05, half the default `max_regression`.
        per_class: one slice per class (classification only; default true for classification).
        features: slices by a feature's value or range (tabular datasets).
    """

    metric: str | None = None
    max_regression: float = 0.1
    min_examples: int = 20
    per_class: bool | None = None
    features: list[FeatureSlice] = field(default_factory=list)


@dataclass(frozen=True)
class EvaluationGate:
    """When a new model may become champion: its test metrics and slices against the champion's.

    Attributes:
        metric: the single-metric spelling's metric (once checked: the primary metric's).
        min: the single-metric spelling's lower bound (higher is better).
        max: the single-metric spelling's upper bound (lower is better).
        max_regression: the single-metric spelling's allowed regression against the champion.
        min_accuracy: the older spelling of `metric: test_accuracy, min: ...`.
        metrics: every gated metric (once checked, never empty).
        slices: the gated slices (once checked, set for every task: per class by default for
            classification).
    """

    metric: str = "test_accuracy"
    min: float | None = None
    max: float | None = None
    max_regression: float = 0.0
    min_accuracy: float | None = None
    metrics: list[MetricBound] = field(default_factory=list)
    slices: SliceGate | None = None

    @property
    def higher_is_better(self) -> bool:
        """The primary metric's direction."""
        return self.max is None

    @property
    def bound(self) -> float:
        """The primary metric's `min` or `max`."""
        value = self.max if self.max is not None else self.min
        assert value is not None, "a loaded gate has min or max"
        return value


def checked_gate(gate: EvaluationGate, problem_type: str, source: str) -> EvaluationGate:
    """The gate with its spelling resolved (`metrics` filled, slices defaulted), or a SpecError
    naming the file and the field."""
    where = f"{source}: evaluation"
    shorthand = (gate.metric, gate.min, gate.max, gate.max_regression, gate.min_accuracy)
    if gate.metrics:
        first = gate.metrics[0]
        # A checked gate mirrors its first metric in the shorthand fields: read back, it is fine.
        mirrored = (first.metric, first.min, first.max, first.max_regression, None)
        if shorthand not in (("test_accuracy", None, None, 0.0, None), mirrored):
            raise SpecError(
                f"{where}: give either metrics (a list) or metric with min or max, not both"
            )
        bounds = [
            _checked_bound(bound, problem_type, f"{where}.metrics[{index}]", gated_by_name=True)
            for index, bound in enumerate(gate.metrics)
        ]
        names = [bound.metric for bound in bounds]
        if len(set(names)) != len(names):
            raise SpecError(f"{where}.metrics: each metric at most once; got {', '.join(names)}")
    else:
        bounds = [_shorthand_bound(gate, problem_type, where)]
    slices = _checked_slices(gate.slices or SliceGate(), problem_type, f"{where}.slices")
    primary = bounds[0]
    return EvaluationGate(
        metric=primary.metric,
        min=primary.min,
        max=primary.max,
        max_regression=primary.max_regression,
        metrics=bounds,
        slices=slices,
    )


def _shorthand_bound(gate: EvaluationGate, problem_type: str, where: str) -> MetricBound:
    bound_key = "min" if gate.max is None else "max"
    if gate.min_accuracy is not None:
        if gate.min is not None or gate.max is not None or gate.metric != "test_accuracy":
            raise SpecError(
                f"{where}.min_accuracy is the older spelling of metric: test_accuracy, min: ...; "
                "do not combine it with metric, min or max"
            )
        gate = dataclasses.replace(gate, min=gate.min_accuracy, min_accuracy=None)
        bound_key = "min_accuracy"
    bound = MetricBound(gate.metric, gate.min, gate.max, gate.max_regression)
    return _checked_bound(bound, problem_type, where, gated_by_name=False, bound_key=bound_key)


def _checked_bound(
    bound: MetricBound,
    problem_type: str,
    where: str,
    *,
    gated_by_name: bool,
    bound_key: str | None = None,
) -> MetricBound:
    allowed = TEST_METRICS[problem_type]
    if bound.metric not in allowed:
        raise SpecError(
            f"{where}.metric {bound.metric!r} is not a metric of task {problem_type!r}; allowed: "
            f"{', '.join(allowed)}"
        )
    if not gated_by_name and (bound.min is None) == (bound.max is None):
        raise SpecError(
            f"{where}: give exactly one of min (higher {bound.metric} is better) or max (lower "
            "is better)"
        )
    if bound.min is not None and bound.max is not None:
        raise SpecError(f"{where}: give min or max, not both")
    if gated_by_name:
        # In the list every metric has its direction by name: a bound on the wrong side is a
        # mistake (a minimum loss), not a choice.
        higher = HIGHER_IS_BETTER[bound.metric]
        wrong = "max" if higher else "min"
        if getattr(bound, wrong) is not None:
            right = "min" if higher else "max"
            raise SpecError(
                f"{where}: {bound.metric} is better {'higher' if higher else 'lower'}; give "
                f"{right}, not {wrong}"
            )
    key = bound_key or ("min" if bound.max is None else "max")
    if bound.metric == "test_accuracy" and bound.bound is not None and not 0 <= bound.bound <= 1:
        raise SpecError(f"{where}.{key} must be within [0, 1]")
    if bound.max_regression < 0:
        raise SpecError(f"{where}.max_regression must be >= 0")
    return bound


def _checked_slices(slices: SliceGate, problem_type: str, where: str) -> SliceGate:
    metric = slices.metric or DEFAULT_SLICE_METRIC[problem_type]
    allowed = SLICE_METRICS[problem_type]
    if metric not in allowed:
        raise SpecError(
            f"{where}.metric {metric!r} is not a slice metric of task {problem_type!r}; allowed: "
            f"{', '.join(allowed)}"
        )
    if slices.max_regression < 0:
        raise SpecError(f"{where}.max_regression must be >= 0")
    if slices.min_examples < 1:
        raise SpecError(f"{where}.min_examples must be >= 1")
    per_class = slices.per_class
    if per_class is None:
        per_class = problem_type == "classification"
    elif per_class and problem_type != "classification":
        raise SpecError(f"{where}.per_class applies only to task classification")
    features = [
        _checked_feature_slice(item, f"{where}.features[{index}]")
        for index, item in enumerate(slices.features)
    ]
    names = [item.name for item in features]
    repeated = sorted({name for name in names if name and names.count(name) > 1})
    if repeated:
        raise SpecError(f"{where}.features: two slices named {repeated[0]!r}; give each a name")
    return dataclasses.replace(slices, metric=metric, per_class=per_class, features=features)


def _checked_feature_slice(item: FeatureSlice, where: str) -> FeatureSlice:
    if item.value is not None and (
        isinstance(item.value, bool) or not isinstance(item.value, str | int)
    ):
        raise SpecError(
            f"{where}.value: expected a value's name or integer id, got {item.value!r:.80}"
        )
    if item.value is not None and (item.min is not None or item.max is not None):
        raise SpecError(f"{where}: give value (a categorical value) or min/max (a range), not both")
    if item.min is not None and item.max is not None and not item.min < item.max:
        raise SpecError(f"{where}: min must be below max")
    if item.max_regression is not None and item.max_regression < 0:
        raise SpecError(f"{where}.max_regression must be >= 0")
    if item.name is not None and not _SLICE_NAME.match(item.name):
        raise SpecError(
            f"{where}.name {item.name!r}: use letters, digits and _ - . : only (it is part of "
            "MLflow metric names)"
        )
    return item
