"""Model builders: a name in a pipeline spec → a Keras 3 model.

Importing this module is cheap (spec validation reads `MODEL_BUILDERS` at DAG parse time); Keras
is imported inside each builder. Every builder takes the input shape, the number of classes and
the spec's hyperparameters, and returns an uncompiled model that outputs logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def small_cnn(
    input_shape: Sequence[int],
    num_classes: int,
    filters: Sequence[int] = (32, 64),
    dense_units: int = 128,
    dropout: float = 0.0,
) -> Any:
    """Conv-pool blocks, then a dense layer (its accuracies: docs/BENCHMARKS.md, "Facts")."""
    import keras

    layers: list[Any] = [keras.Input(shape=tuple(input_shape))]
    for width in filters:
        layers += [
            keras.layers.Conv2D(width, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
        ]
    layers += [keras.layers.Flatten(), keras.layers.Dense(dense_units, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(num_classes))
    return keras.Sequential(layers, name="small_cnn")


def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    hidden_units: Sequence[int] = (128, 64),
    dropout: float = 0.0,
) -> Any:
    """Flatten, then fully connected ReLU layers."""
    import keras

    layers: list[Any] = [keras.Input(shape=tuple(input_shape)), keras.layers.Flatten()]
    for width in hidden_units:
        layers.append(keras.layers.Dense(width, activation="relu"))
        if dropout:
            layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(num_classes))
    return keras.Sequential(layers, name="mlp")


MODEL_BUILDERS: dict[str, Callable[..., Any]] = {"small_cnn": small_cnn, "mlp": mlp}


def has_random_layers(builder: str, hyperparameters: dict[str, Any]) -> bool:
    """Whether the model has layers that draw random numbers (Dropout), without building it.

    A builder declares Dropout through its `dropout` hyperparameter: the model has Dropout
    layers exactly when that value (or the builder's default) is non-zero. A builder without
    that hyperparameter is taken to have none; the training process checks the built model again.
    """
    import inspect

    parameter = inspect.signature(MODEL_BUILDERS[builder]).parameters.get("dropout")
    default = parameter.default if parameter is not None else 0.0
    return bool(hyperparameters.get("dropout", default))


def build_model(
    builder: str, input_shape: Sequence[int], num_classes: int, hyperparameters: dict[str, Any]
) -> Any:
    """Build the model named `builder`; a bad hyperparameter name fails with the allowed ones."""
    import inspect

    if builder not in MODEL_BUILDERS:
        raise ValueError(
            f"model.builder {builder!r} is unknown; allowed: {', '.join(sorted(MODEL_BUILDERS))}"
        )
    function = MODEL_BUILDERS[builder]
    allowed = [
        p for p in inspect.signature(function).parameters if p not in ("input_shape", "num_classes")
    ]
    unknown = sorted(set(hyperparameters) - set(allowed))
    if unknown:
        raise ValueError(
            f"model.hyperparameters: {unknown[0]!r} is not a hyperparameter of {builder!r}; "
            f"allowed: {', '.join(allowed)}"
        )
    return function(input_shape, num_classes, **hyperparameters)
