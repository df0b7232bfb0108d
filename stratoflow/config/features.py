"""What a model builder is told about its data: the features it takes and the target it predicts.

A model builder (`model.builder` in `pipeline.yaml`) is called as

    build(features: Features, target: Target, **hyperparameters) -> keras.Model

and returns an uncompiled Keras 3 model that takes the features as `load_split` gives them and
outputs `target.num_outputs` values per example: logits (one per class, no softmax) for
classification, the predictions for regression.

- image features: one float32 tensor of shape `features.shape` (height, width, channels),
  scaled to [0, 1];
- tabular features: a dict with one scalar tensor per column, keyed by `Column.name`: float32
  for `numeric` columns, int64 ids in `[0, vocabulary_size)` for `categorical` ones.

Both describe themselves as JSON (`to_dict` / `from_dict`): they travel inside the dataset
reference between tasks.

Pipeline code imports these names from `stratoflow.api` (the same objects); importing them from
here still works but is not kept stable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

IMAGE = "image"
TABULAR = "tabular"
NUMERIC = "numeric"
CATEGORICAL = "categorical"
CLASSIFICATION = "classification"
REGRESSION = "regression"


@dataclass(frozen=True)
class Column:
    """One column of tabular features.

    Attributes:
        name: the key of the column in the features dict.
        kind: `numeric` (float32) or `categorical` (int64 ids).
        vocabulary: a categorical column's value names, index = id (empty for numeric).
    """

    name: str
    kind: str
    vocabulary: tuple[str, ...] = ()

    @property
    def vocabulary_size(self) -> int:
        """How many ids a categorical column takes (0 for a numeric one)."""
        return len(self.vocabulary)


@dataclass(frozen=True)
class Features:
    """The model's input.

    Attributes:
        kind: `image` or `tabular`.
        shape: an image's shape, `(height, width, channels)` (empty for tabular).
        columns: the tabular columns, in the dataset's order (empty for images).
    """

    kind: str
    shape: tuple[int, ...] = ()
    columns: tuple[Column, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON types."""
        return {
            "kind": self.kind,
            "shape": list(self.shape),
            "columns": [
                {"name": c.name, "kind": c.kind, "vocabulary": list(c.vocabulary)}
                for c in self.columns
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Features:
        """Rebuild from `to_dict()` output."""
        if data["kind"] not in (IMAGE, TABULAR):
            raise ValueError(f"features.kind {data['kind']!r} is neither {IMAGE} nor {TABULAR}")
        return cls(
            kind=str(data["kind"]),
            shape=tuple(int(d) for d in data["shape"]),
            columns=tuple(
                Column(str(c["name"]), str(c["kind"]), tuple(str(v) for v in c["vocabulary"]))
                for c in data["columns"]
            ),
        )


@dataclass(frozen=True)
class Target:
    """What the model predicts.

    Attributes:
        task: `classification` or `regression`.
        class_names: classification: the class names, index = class id.
        num_targets: regression: how many float targets per example (1: a scalar).
    """

    task: str
    class_names: tuple[str, ...] = ()
    num_targets: int = 1

    @property
    def num_outputs(self) -> int:
        """Units of the model's last layer: one per class, or one per regression target."""
        return len(self.class_names) if self.task == CLASSIFICATION else self.num_targets

    def to_dict(self) -> dict[str, Any]:
        """JSON types."""
        return {
            "task": self.task,
            "class_names": list(self.class_names),
            "num_targets": self.num_targets,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        """Rebuild from `to_dict()` output."""
        if data["task"] not in (CLASSIFICATION, REGRESSION):
            raise ValueError(f"target.task {data['task']!r} is not {CLASSIFICATION}/{REGRESSION}")
        return cls(
            task=str(data["task"]),
            class_names=tuple(str(n) for n in data["class_names"]),
            num_targets=int(data["num_targets"]),
        )
