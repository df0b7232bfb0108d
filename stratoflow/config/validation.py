"""The data gate's declaration: the `validation:` section of `pipeline.yaml`.

The data gate (`stratoflow.training.data_gate`) runs before any training and compares the run's
prepared data with the champion's (its statistics, logged with the champion's run): the schema,
the drift of every feature and of the labels, and anomalies (missing values, values out of a
declared range). This module holds what a pipeline declares about it, and checks it at parse time
without importing anything heavy. Every key has a default, so a pipeline without the section gets
the default gate:

    validation:
      distance: psi            # psi (population stability index) or js (Jensen-Shannon distance)
      max_drift: 0.25          # every feature's and the labels' bound (default: psi 0.25, js 0.1)
      drift: {body_mass_g: 0.4}        # a bound per feature (`label` for the labels)
      max_missing: 0.05        # the share of missing values allowed in any feature of any split
      missing: {sex: 0.2}      # a bound per feature
      ranges: {flipper_length_mm: {min: 150, max: 250}}   # values allowed, per numeric feature
      check_schema: true       # features, types, shapes, vocabularies, classes vs the champion's
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stratoflow.config.parsing import SpecError

# The distances the gate measures drift with, and each one's default bound.
DISTANCES = {"psi": 0.25, "js": 0.1}
DISTANCE_NAMES = {"psi": "population stability index", "js": "Jensen-Shannon distance"}
DEFAULT_MAX_MISSING = 0.05
# The name a per-feature key uses for the labels (classification) or the target (regression).
LABEL = "label"


@dataclass(frozen=True)
class ValidationSpec:
    """What the data gate checks before training (`validation:` in `pipeline.yaml`).

    Attributes:
        distance: `psi` (population stability index over the champion's deciles, or the
            categories) or `js` (Jensen-Shannon distance, base 2, in [0, 1]).
        max_drift: the drift bound of every feature and of the labels; None: the distance's
            default (`DISTANCES`).
        drift: a bound per feature (`label`: the labels or the regression target).
        max_missing: the share of an example's feature that may be missing (NaN, an id outside
            the vocabulary), in [0, 1], in every split.
        missing: a bound per feature.
        ranges: per numeric feature (or `label` for a regression target), `{min: .., max: ..}`
            (either may be left out): a value outside is an anomaly.
        check_schema: compare the features (names, types, image shape, vocabularies) and the
            label classes with the champion's.
    """

    distance: str = "psi"
    max_drift: float | None = None
    drift: dict[str, Any] = field(default_factory=dict)
    max_missing: float = DEFAULT_MAX_MISSING
    missing: dict[str, Any] = field(default_factory=dict)
    ranges: dict[str, Any] = field(default_factory=dict)
    check_schema: bool = True

    def drift_bound(self, feature: str) -> float:
        """The drift bound of `feature` (or `label`)."""
        if feature in self.drift:
            return float(self.drift[feature])
        return self.max_drift if self.max_drift is not None else DISTANCES[self.distance]

    def missing_bound(self, feature: str) -> float:
        """The share of missing values allowed in `feature`."""
        return float(self.missing.get(feature, self.max_missing))

    def range_of(self, feature: str) -> tuple[float | None, float | None]:
        """The declared `(min, max)` of `feature`; None where not declared."""
        declared = self.ranges.get(feature) or {}
        low, high = declared.get("min"), declared.get("max")
        return (
            None if low is None else float(low),
            None if high is None else float(high),
        )


def check_validation(validation: ValidationSpec, source: str) -> None:
    """Refuse a `validation:` section with a value out of bounds.

    Raises:
        SpecError: naming the file and the field, and the allowed values.
    """
    where = f"{source}: validation"
    if validation.distance not in DISTANCES:
        raise SpecError(
            f"{where}.distance {validation.distance!r} is not allowed; allowed: "
            + ", ".join(f"{name} ({DISTANCE_NAMES[name]})" for name in DISTANCES)
        )
    if validation.max_drift is not None:
        _positive(validation.max_drift, f"{where}.max_drift")
    for feature, bound in validation.drift.items():
        _positive(bound, f"{where}.drift.{feature}")
    _share(validation.max_missing, f"{where}.max_missing")
    for feature, bound in validation.missing.items():
        _share(bound, f"{where}.missing.{feature}")
    for feature, declared in validation.ranges.items():
        what = f"{where}.ranges.{feature}"
        if not isinstance(declared, dict) or not declared or set(declared) - {"min", "max"}:
            raise SpecError(f"{what}: expected a mapping with min and/or max, got {declared!r}")
        for key, value in declared.items():
            _number(value, f"{what}.{key}")
        if "min" in declared and "max" in declared and declared["min"] > declared["max"]:
            raise SpecError(f"{what}: min {declared['min']} is above max {declared['max']}")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _positive(value: Any, where: str) -> None:
    if _number(value, where) <= 0:
        raise SpecError(f"{where}: expected a number above 0, got {value!r}")


def _share(value: Any, where: str) -> None:
    if not 0.0 <= _number(value, where) <= 1.0:
        raise SpecError(f"{where}: expected a share within [0, 1], got {value!r}")
