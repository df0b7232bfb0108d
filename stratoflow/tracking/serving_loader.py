"""The served model's `predict`: what a user of a served champion gets back.

MLflow copies this file into every logged model (`code/stratoflow_serving.py`) and names it as
the model's `python_function` loader, so MLflow's scoring server (`stratoflow serve-model`) and
`mlflow.pyfunc.load_model(...).predict` answer with

- classification: one column `probability_<class name>` per class, `predicted_class` (the name)
  and `predicted_class_id`;
- regression: `prediction` (`prediction_<i>` per target for several targets).

The Keras model itself stays the `keras` flavor (`mlflow.keras.load_model` returns it: logits
for classification). Tabular models take a DataFrame with one column per feature column
(categorical columns as their integer ids); image models an array of images scaled to [0, 1].

Self-contained on purpose (NumPy, pandas and Keras only, nothing of stratoflow): a served model
must load where stratoflow is not installed.
"""

from __future__ import annotations

import json
import os
from typing import Any

SERVING_CONFIG = "stratoflow_serving.json"


class ServedModel:
    """A Keras model and what its outputs mean (`task`, class names, input columns)."""

    def __init__(self, model: Any, config: dict[str, Any]):
        self.model = model
        self.config = config

    def predict(self, model_input: Any, params: Any = None) -> Any:
        """Class probabilities and the predicted class, or the regression prediction."""
        import numpy as np
        import pandas as pd

        outputs = np.asarray(self.model.predict(self._inputs(model_input), verbose=0))
        if self.config["task"] == "classification":
            shifted = outputs - outputs.max(axis=-1, keepdims=True)
            probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
            names = list(self.config["class_names"])
            frame = pd.DataFrame(probabilities, columns=[f"probability_{n}" for n in names])
            ids = probabilities.argmax(axis=-1)
            frame["predicted_class"] = [names[i] for i in ids]
            frame["predicted_class_id"] = ids.astype("int64")
            return frame
        outputs = outputs.reshape(len(outputs), -1)
        if outputs.shape[1] == 1:
            return pd.DataFrame({"prediction": outputs[:, 0]})
        return pd.DataFrame(outputs, columns=[f"prediction_{i}" for i in range(outputs.shape[1])])

    def _inputs(self, model_input: Any) -> Any:
        import numpy as np
        import pandas as pd

        columns = self.config.get("columns") or []
        if columns:
            if isinstance(model_input, pd.DataFrame):
                model_input = {c: model_input[c].to_numpy() for c in model_input.columns}
            return {
                c["name"]: np.asarray(
                    model_input[c["name"]],
                    dtype="int64" if c["kind"] == "categorical" else "float32",
                )
                for c in columns
            }
        if isinstance(model_input, pd.DataFrame):
            model_input = model_input.to_numpy()
        array = np.asarray(model_input, dtype="float32")
        return array.reshape((-1, *self.config["shape"]))


def _load_pyfunc(data_path: str) -> ServedModel:
    """MLflow's entry point: `data_path` is the keras flavor's data folder."""
    import keras

    with open(os.path.join(data_path, SERVING_CONFIG)) as stream:
        config = json.load(stream)
    return ServedModel(keras.saving.load_model(os.path.join(data_path, "model.keras")), config)
