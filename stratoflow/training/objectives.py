"""The objective of a problem type (a pipeline's `task:`): its loss, epoch metric and optimizer.

| problem type | model outputs | loss (per example) | epoch metric | test metrics |
|---|---|---|---|---|
| `classification` | one logit per class | sparse categorical cross-entropy | `accuracy` | `test_loss`, `test_accuracy`, per-class precision/recall |
| `regression` | one value per target | mean squared error | `mae` | `test_loss` (MSE), `test_mae`, `test_rmse` |

The custom loop and `fit` both read them from here, so every strategy trains the same objective.
"""  # noqa: E501

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from stratoflow.config import names
from stratoflow.config.features import CLASSIFICATION


@dataclass(frozen=True)
class Objective:
    """The loss and the epoch metric of one problem type.

    Attributes:
        problem_type: `classification` or `regression`.
        metric: the epoch metric's MLflow name (`accuracy`, `mae`); validation adds `val_`.
    """

    problem_type: str

    @property
    def metric(self) -> str:
        return names.epoch_metric(self.problem_type)

    def per_example_loss(self, targets: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """One loss value per example (the loop scales it by the global batch)."""
        if self.problem_type == CLASSIFICATION:
            return tf.keras.losses.sparse_categorical_crossentropy(
                targets, outputs, from_logits=True
            )
        errors = outputs - tf.reshape(tf.cast(targets, outputs.dtype), tf.shape(outputs))
        return tf.reduce_mean(tf.square(errors), axis=-1)

    def metric_sum(self, targets: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """The epoch metric summed over the batch's examples (divided by the count later)."""
        if self.problem_type == CLASSIFICATION:
            predicted = tf.argmax(outputs, axis=-1, output_type=tf.int64)
            return tf.reduce_sum(
                tf.cast(tf.equal(predicted, tf.cast(targets, tf.int64)), tf.float32)
            )
        errors = outputs - tf.reshape(tf.cast(targets, outputs.dtype), tf.shape(outputs))
        return tf.reduce_sum(tf.reduce_mean(tf.abs(errors), axis=-1))

    def keras_loss(self) -> Any:
        """The same loss for Keras `fit`."""
        if self.problem_type == CLASSIFICATION:
            return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return tf.keras.losses.MeanSquaredError()

    def keras_metric(self) -> Any:
        """The same epoch metric for Keras `fit`, under the same name."""
        if self.problem_type == CLASSIFICATION:
            return tf.keras.metrics.SparseCategoricalAccuracy(name=self.metric)
        return tf.keras.metrics.MeanAbsoluteError(name=self.metric)


def make_optimizer(optimizer: dict[str, Any], learning_rate: float) -> Any:
    """The Keras optimizer a spec's `optimizer` section names, with the run's learning rate.

    Args:
        optimizer: `{"name": "adamw", "weight_decay": 0.004, ...}`: a Keras optimizer name and
            its constructor's keyword arguments (not `learning_rate`).
        learning_rate: `training.learning_rate`.

    Raises:
        ValueError: an unknown name, or an argument the optimizer does not take (naming it
            and the allowed ones).
    """
    import keras

    arguments = {key: value for key, value in optimizer.items() if key != "name"}
    name = str(optimizer.get("name"))
    try:
        cls = type(keras.optimizers.get(name))
    except ValueError:
        raise ValueError(f"name {name!r} is not a Keras optimizer") from None
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise ValueError(
            f"{unknown[0]!r} is not an argument of Keras optimizer {name!r}; allowed: "
            f"{', '.join(a for a in allowed if a != 'learning_rate')}"
        )
    return cls(learning_rate=learning_rate, **arguments)
