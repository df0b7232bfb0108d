"""Slices of the test split: which examples each gated slice holds, and its metrics.

A slice is a subset of the test examples: one class (its accuracy is the class's recall), one
value of a categorical feature, or a range of a numeric one (`evaluation.slices` in the spec,
`stratoflow.config.evaluation_spec.SliceGate`). Each is scored with the metrics of the whole
split (`evaluation.score_logits` / `score_regression` on its examples), logged to the run as
`test_slice/<slice>/<metric>` (and `test_slice/<slice>/examples`), and compared with the same
metric of the champion's run by the gate (`evaluation.decide_gate`).

Feature values are the dataset's own, read before the pipeline's `preprocess`: a slice declared
as `body_mass_g >= 4000` means grams, whatever scaling the model sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from stratoflow.config import names
from stratoflow.config.evaluation_spec import FeatureSlice, SliceGate
from stratoflow.config.features import CATEGORICAL, TABULAR, Features, Target
from stratoflow.config.parsing import SpecError
from stratoflow.training import evaluation
from stratoflow.training.evaluation import SliceScore

EXAMPLES = "examples"
_UNSAFE = re.compile(r"[^\w.\-:]+")


@dataclass(frozen=True)
class TestSlice:
    """Which test examples one slice holds.

    Attributes:
        name: its name in MLflow metric names and reports (`class_3`, `island_Biscoe`).
        description: what it is, for people (`class 3 (Chinstrap)`, `island = Biscoe`).
        mask: one boolean per test example.
        max_regression: how far below the champion's value it may fall.
    """

    __test__ = False  # not a pytest test class, despite its name

    name: str
    description: str
    mask: np.ndarray
    max_regression: float


def check_feature_slices(gate: SliceGate | None, features: Features, source: str) -> None:
    """Refuse feature slices the dataset cannot have, in the run's first task.

    Raises:
        SpecError: a slice names a feature the dataset lacks, slices image data, gives a value
            of a numeric column or a range of a categorical one, or a value not in the column's
            vocabulary; naming the file and the field.
    """
    if gate is None:
        return
    for index, item in enumerate(gate.features):
        where = f"{source}: evaluation.slices.features[{index}]"
        if features.kind != TABULAR:
            raise SpecError(f"{where}: feature slices need tabular data; this dataset is images")
        columns = {column.name: column for column in features.columns}
        column = columns.get(item.feature)
        if column is None:
            raise SpecError(
                f"{where}.feature {item.feature!r} is not a column of the dataset; columns: "
                f"{', '.join(columns)}"
            )
        ranged = item.min is not None or item.max is not None
        if column.kind == CATEGORICAL:
            if ranged:
                raise SpecError(
                    f"{where}: {item.feature} is categorical; slice it by value, not min/max"
                )
            if item.value is not None:
                _category_id(item, column.vocabulary, where)
        elif item.value is not None or not ranged:
            raise SpecError(f"{where}: {item.feature} is numeric; slice it by min and/or max")


def build_slices(
    gate: SliceGate, raw_features: Any, targets: np.ndarray, features: Features, target: Target
) -> list[TestSlice]:
    """The slices of the test split the gate declares, in order: per class, then by feature.

    Args:
        gate: the spec's checked `evaluation.slices`.
        raw_features: the test split's features before the pipeline's `preprocess` (a dict of
            column arrays for tabular data).
        targets: the test split's targets, in the same order.
        features: what the dataset's features are (columns, vocabularies).
        target: what the model predicts (class names).
    """
    slices: list[TestSlice] = []
    if gate.per_class:
        for label, class_name in enumerate(target.class_names):
            named = f" ({class_name})" if class_name != str(label) else ""
            description = f"class {label}{named}"
            slices.append(
                TestSlice(f"class_{label}", description, targets == label, gate.max_regression)
            )
    columns = {column.name: column for column in features.columns}
    for item in gate.features:
        column = columns[item.feature]
        values = np.asarray(raw_features[item.feature])
        allowed = gate.max_regression if item.max_regression is None else item.max_regression
        if column.kind == CATEGORICAL:
            ids = (
                [_category_id(item, column.vocabulary, "evaluation.slices")]
                if item.value is not None
                else range(len(column.vocabulary))
            )
            for value_id in ids:
                value_name = column.vocabulary[value_id] if column.vocabulary else str(value_id)
                name = item.name or _safe(f"{item.feature}_{value_name}")
                slices.append(
                    TestSlice(name, f"{item.feature} = {value_name}", values == value_id, allowed)
                )
            continue
        low = -np.inf if item.min is None else item.min
        high = np.inf if item.max is None else item.max
        slices.append(
            TestSlice(
                item.name or _range_name(item),
                f"{item.feature} in [{_number(item.min, '-inf')}, {_number(item.max, 'inf')})",
                (values >= low) & (values < high),
                allowed,
            )
        )
    return slices


def score_slices(
    outputs: np.ndarray, targets: np.ndarray, problem_type: str, slices: list[TestSlice]
) -> list[SliceScore]:
    """Each slice's metrics (those of the whole split, without `test_`), from the model's outputs
    on the test split. A slice without examples has no metrics."""
    scores = []
    for item in slices:
        count = int(item.mask.sum())
        metrics: dict[str, float] = {}
        if count:
            if problem_type == "regression":
                result = evaluation.score_regression(outputs[item.mask], targets[item.mask])
            else:
                result = evaluation.score_logits(outputs[item.mask], targets[item.mask])
            metrics = {
                key.removeprefix("test_"): value
                for key, value in result.metrics().items()
                if "_class_" not in key
            }
        scores.append(SliceScore(item.name, item.description, count, item.max_regression, metrics))
    return scores


def mlflow_metrics(scores: list[SliceScore]) -> dict[str, float]:
    """The slices' metrics as MLflow metrics (`test_slice/<slice>/<metric>`, and `examples`)."""
    flat: dict[str, float] = {}
    for score in scores:
        flat[names.slice_metric(score.name, EXAMPLES)] = float(score.examples)
        for metric, value in score.metrics.items():
            flat[names.slice_metric(score.name, metric)] = value
    return flat


def _category_id(item: FeatureSlice, vocabulary: tuple[str, ...], where: str) -> int:
    value = item.value
    if isinstance(value, str):
        if value in vocabulary:
            return vocabulary.index(value)
        raise SpecError(
            f"{where}.value {value!r} is not a value of {item.feature}; values: "
            f"{', '.join(vocabulary)} (or their ids 0-{len(vocabulary) - 1})"
        )
    if not 0 <= int(value) < max(len(vocabulary), 1):
        raise SpecError(
            f"{where}.value {value} is not an id of {item.feature}; ids: 0-{len(vocabulary) - 1}"
        )
    return int(value)


def _range_name(item: FeatureSlice) -> str:
    if item.min is not None and item.max is not None:
        return _safe(f"{item.feature}_{_number(item.min)}_to_{_number(item.max)}")
    if item.min is not None:
        return _safe(f"{item.feature}_from_{_number(item.min)}")
    return _safe(f"{item.feature}_below_{_number(item.max)}")


def _number(value: float | None, missing: str = "") -> str:
    return missing if value is None else f"{value:g}"


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name).strip("_") or "slice"
