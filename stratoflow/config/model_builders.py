"""The bundled model builders and the light checks of a spec's `model` (no Keras at import).

Every builder, bundled or a pipeline's own, follows one contract (`stratoflow.config.features`):

    build(features: Features, target: Target, **hyperparameters) -> keras.Model

It returns an uncompiled model taking the features as `stratoflow.data.datasets.load_split`
gives them (an image tensor, or a dict of tabular columns) and outputting
`target.num_outputs` values: logits for classification, predictions for regression.

`model.builder` is a bundled builder's name (`MODEL_BUILDERS`) or an import path `module:name`
(`stratoflow.config.plugins`). The bundled builders live here, beside the configuration, because
resolving a run plan (`stratoflow.config.run_plan`, at DAG parse time) reads their signatures:
which hyperparameters they take, whether they have Dropout. Keras is imported inside each
builder, so importing this module stays cheap. Building and checking a model is
`stratoflow.training.models`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stratoflow.config.features import CATEGORICAL, IMAGE, TABULAR, Features, Target
from stratoflow.config.parsing import SpecError
from stratoflow.config.plugins import load_object

# The contract's first two parameters; every other parameter is a hyperparameter, except
# `statistics`: a builder that takes it receives the training split's statistics
# (`stratoflow.data.statistics.SplitStatistics`) to set up normalisation and lookup layers.
CONTRACT_PARAMETERS = ("features", "target")
STATISTICS_PARAMETER = "statistics"


def small_cnn(
    features: Features,
    target: Target,
    filters: Sequence[int] = (32, 64),
    dense_units: int = 128,
    dropout: float = 0.0,
) -> Any:
    """Conv-pool blocks, then a dense layer (its accuracies: docs/BENCHMARKS.md, "Facts").

    Images only.
    """
    import keras

    if features.kind != IMAGE:
        raise ValueError(f"small_cnn takes image features, not {features.kind}; use mlp")
    layers: list[Any] = [keras.Input(shape=tuple(features.shape))]
    for width in filters:
        layers += [
            keras.layers.Conv2D(width, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
        ]
    layers += [keras.layers.Flatten(), keras.layers.Dense(dense_units, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    layers.append(keras.layers.Dense(target.num_outputs))
    return keras.Sequential(layers, name="small_cnn")


def mlp(
    features: Features,
    target: Target,
    hidden_units: Sequence[int] = (128, 64),
    dropout: float = 0.0,
) -> Any:
    """Fully connected ReLU layers over a flattened image, or over the tabular columns.

    Tabular columns enter as one input each: numeric ones as they are, categorical ones
    one-hot encoded over their vocabulary.
    """
    import keras

    inputs: Any
    if features.kind == TABULAR:
        inputs = {}
        parts = []
        for column in features.columns:
            dtype = "int64" if column.kind == CATEGORICAL else "float32"
            inputs[column.name] = keras.Input(shape=(), dtype=dtype, name=column.name)
            if column.kind == CATEGORICAL:
                parts.append(keras.ops.one_hot(inputs[column.name], column.vocabulary_size))
            else:
                parts.append(keras.ops.expand_dims(inputs[column.name], -1))
        x = keras.layers.Concatenate()(parts) if len(parts) > 1 else parts[0]
    else:
        inputs = keras.Input(shape=tuple(features.shape))
        x = keras.layers.Flatten()(inputs)
    for width in hidden_units:
        x = keras.layers.Dense(width, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(target.num_outputs)(x)
    return keras.Model(inputs, outputs, name="mlp")


MODEL_BUILDERS: dict[str, Callable[..., Any]] = {"small_cnn": small_cnn, "mlp": mlp}


def resolve_builder(
    builder: str, folder: str | Path | None = None, where: str = "model.builder"
) -> Callable[..., Any]:
    """The function `builder` names: a bundled builder's name, or an import path `module:name`.

    Raises:
        SpecError: an unknown name, an import path that does not resolve, or not a function
            taking `(features, target, ...)`; the message names `where`.
    """
    if ":" not in builder:
        if builder not in MODEL_BUILDERS:
            raise SpecError(
                f"{where} {builder!r} is not a known model builder; allowed: "
                f"{', '.join(sorted(MODEL_BUILDERS))}, or an import path 'module:function'"
            )
        return MODEL_BUILDERS[builder]
    function = load_object(builder, folder, where)
    if not callable(function):
        raise SpecError(f"{where} {builder!r} is not a function: {function!r:.200}")
    parameters = list(inspect.signature(function).parameters)
    if tuple(parameters[:2]) != CONTRACT_PARAMETERS:
        raise SpecError(
            f"{where} {builder!r} must take (features, target, **hyperparameters); its "
            f"parameters are ({', '.join(parameters)})"
        )
    return function


def hyperparameter_names(function: Callable[..., Any]) -> list[str] | None:
    """The hyperparameters a builder accepts; None if it takes any (`**kwargs`)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return [name for name in parameters if name not in (*CONTRACT_PARAMETERS, STATISTICS_PARAMETER)]


def takes_statistics(function: Callable[..., Any]) -> bool:
    """Whether a builder asks for the training split's statistics (a `statistics` parameter)."""
    return STATISTICS_PARAMETER in inspect.signature(function).parameters


def check_hyperparameters(
    function: Callable[..., Any], hyperparameters: dict[str, Any], builder: str, where: str
) -> None:
    """Refuse a hyperparameter the builder's signature does not take.

    Raises:
        SpecError: naming the hyperparameter and the allowed ones.
    """
    allowed = hyperparameter_names(function)
    if allowed is None:
        return
    unknown = sorted(set(hyperparameters) - set(allowed))
    if unknown:
        raise SpecError(
            f"{where}.hyperparameters: {unknown[0]!r} is not a hyperparameter of {builder!r}; "
            f"allowed: {', '.join(allowed) or 'none'}"
        )


def has_random_layers(
    builder: str, hyperparameters: dict[str, Any], folder: str | Path | None = None
) -> bool:
    """Whether the model has layers that draw random numbers (Dropout), without building it.

    A bundled builder declares Dropout through its `dropout` hyperparameter: the model has
    Dropout layers exactly when that value (or the builder's default) is non-zero. A pipeline's
    own builder is not imported for this (it may be called at DAG parse time): taken to have
    none; the training process checks the built model again.
    """
    if builder not in MODEL_BUILDERS:
        return False
    parameter = inspect.signature(MODEL_BUILDERS[builder]).parameters.get("dropout")
    default = parameter.default if parameter is not None else 0.0
    return bool(hyperparameters.get("dropout", default))
