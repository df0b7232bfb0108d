"""The diabetes pipeline's own model: `model.builder: "model:build"` in `pipeline.yaml`.

The contract (docs/reference/pipeline-code.md): `build(features, target, **hyperparameters)` returns
an uncompiled Keras 3 model taking the features as the dataset gives them (a dict of scalar
columns here) and giving `target.num_outputs` values per example.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from stratoflow.api import Features, Target


def build(
    features: Features,
    target: Target,
    hidden_units: Sequence[int] = (32,),
    target_centre: float = 150.0,
    target_scale: float = 75.0,
) -> keras.Model:
    """A small MLP over the numeric columns whose output is rescaled to the target's range.

    The last layer predicts about N(0, 1); `target_centre + target_scale * output` puts it where
    the disease progression lies (25 to 346), so training starts near the mean, not at 0.
    """
    inputs = {c.name: keras.Input(shape=(), dtype="float32", name=c.name) for c in features.columns}
    x = keras.layers.Concatenate()(
        [keras.ops.expand_dims(inputs[c.name], -1) for c in features.columns]
    )
    for width in hidden_units:
        x = keras.layers.Dense(width, activation="relu")(x)
    output = keras.layers.Dense(target.num_outputs)(x)
    prediction = keras.layers.Rescaling(scale=target_scale, offset=target_centre)(output)
    return keras.Model(inputs, prediction, name="diabetes_mlp")
