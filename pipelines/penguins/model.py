"""The penguins' model: each measurement standardised by the training split's own statistics.

`model.builder: "model:build"`. The builder asks for `statistics` (the training split's, from
the run's first task: `stratoflow.api.SplitStatistics`), so the centres and scales of the
`Normalization` layers come from the data the model trains on, not from constants in the code;
the layers are part of the model, so the served model standardises its inputs itself.
Categorical columns are one-hot encoded over their vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stratoflow.api import CATEGORICAL, Features, SplitStatistics, Target


def build(
    features: Features,
    target: Target,
    statistics: SplitStatistics,
    hidden_units: Sequence[int] = (32, 16),
) -> Any:
    """An MLP over the standardised measurements and the one-hot categorical columns."""
    import keras

    inputs: dict[str, Any] = {}
    parts = []
    for column in features.columns:
        if column.kind == CATEGORICAL:
            inputs[column.name] = keras.Input(shape=(), dtype="int64", name=column.name)
            parts.append(keras.ops.one_hot(inputs[column.name], column.vocabulary_size))
        else:
            inputs[column.name] = keras.Input(shape=(), dtype="float32", name=column.name)
            measured = statistics[column.name]
            scale = keras.layers.Normalization(
                mean=measured.mean, variance=measured.variance, name=f"standardize_{column.name}"
            )
            parts.append(scale(keras.ops.expand_dims(inputs[column.name], -1)))
    x = keras.layers.Concatenate()(parts)
    for width in hidden_units:
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(target.num_outputs)(x), name="penguins_mlp")
