"""A Keras layer a model can be trained and evaluated with but not served.

`PassThrough` is registered only in a process that imported this module: a fresh serving process
cannot load a model that uses it (`Could not locate class 'PassThrough'`), as with a pipeline's
own layer that its served model does not ship.
"""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="stratoflow_tests")
class PassThrough(keras.layers.Layer):
    """Returns its inputs unchanged."""

    def call(self, inputs: Any) -> Any:
        return inputs


def with_pass_through(model: keras.Model) -> keras.Model:
    """`model` with `PassThrough` after its outputs: the same answers, a layer of its own."""
    return keras.Model(model.inputs, PassThrough()(model.outputs[0]))
