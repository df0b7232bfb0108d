"""MLflow's model folder for a saved Keras file, written without importing Keras.

The folder is what `mlflow.keras.save_model` writes (MLflow 3.17, Keras 3, not exported): the
`keras` flavor over `data/model.keras`, so `mlflow.keras.load_model` returns the Keras model. Its
`python_function` flavor loads through a copy of `stratoflow.tracking.serving_loader` shipped in
the model (`code/`), with the task, class names and columns beside the Keras file
(`serving_loader.SERVING_CONFIG`).

MLflow's own `save_model` needs the model in memory, and so TensorFlow, in the process that logs
it. Copying the file the training process saved keeps TensorFlow, and the pipeline's model code,
out of the Airflow task process that holds MLflow's account.
"""

from __future__ import annotations

import json
import os
import shutil
import types
from typing import Any

from stratoflow.tracking import serving_loader

# The served model's loader module, as copied into every logged model's `code/` folder.
SERVING_MODULE = "stratoflow_serving"
# The names `mlflow.keras` gives its flavor, data folder and files (mlflow/keras/save.py).
FLAVOR = "keras"
DATA = "data"
KERAS_FILE = "model.keras"
KERAS_MODULE_FILE = "keras_module.txt"


def flavor(keras_version: str, serving_config: dict[str, Any]) -> Any:
    """A flavor for `mlflow.models.Model.log(flavor=..., model=<path of the .keras file>)`.

    Args:
        keras_version: the Keras that saved the file (the training process's).
        serving_config: what the served model's outputs mean (`serving_loader.ServedModel`).
    """

    def save_model(
        path: str,
        mlflow_model: Any,
        model: str,
        signature: Any = None,
        input_example: Any = None,
        pip_requirements: list[str] | None = None,
        **_: Any,
    ) -> None:
        from mlflow import pyfunc
        from mlflow.models.model import MLMODEL_FILE_NAME
        from mlflow.models.utils import _save_example
        from mlflow.utils.file_utils import get_total_file_size

        os.makedirs(path, exist_ok=True)
        # A tabular model's signature is a table of columns (what its served `predict` takes),
        # which the keras flavor's own save would refuse: it accepts tensor signatures only.
        mlflow_model.signature = signature
        if input_example is not None:
            _save_example(mlflow_model, input_example, path)
        data = os.path.join(path, DATA)
        os.makedirs(data)
        with open(os.path.join(data, KERAS_MODULE_FILE), "w") as stream:
            stream.write("keras")
        shutil.copyfile(model, os.path.join(data, KERAS_FILE))
        with open(os.path.join(data, serving_loader.SERVING_CONFIG), "w") as stream:
            json.dump(serving_config, stream)
        code = os.path.join(path, "code")
        os.makedirs(code)
        shutil.copy(serving_loader.__file__, os.path.join(code, f"{SERVING_MODULE}.py"))
        mlflow_model.add_flavor(
            FLAVOR,
            data=DATA,
            keras_version=keras_version,
            keras_backend="tensorflow",
            save_exported_model=False,
        )
        # The loader gets the keras flavor's data folder (the `.keras` file) as its path.
        pyfunc.add_to_model(
            mlflow_model,
            loader_module=SERVING_MODULE,
            data=DATA,
            code="code",
            conda_env="conda.yaml",
            python_env="python_env.yaml",
        )
        if size := get_total_file_size(path):
            mlflow_model.model_size_bytes = size
        mlflow_model.save(os.path.join(path, MLMODEL_FILE_NAME))
        _write_environment(path, pip_requirements or [])

    return types.SimpleNamespace(__name__="mlflow.keras", save_model=save_model)


def _write_environment(path: str, pip_requirements: list[str]) -> None:
    """`conda.yaml`, `requirements.txt` and `python_env.yaml`, as MLflow's flavors write them.

    The requirements are pinned already (the builds that trained the model, and MLflow): MLflow's
    own processing would also compare them with what this process has installed, which says
    nothing of where the model was trained (and took 0.6 s).
    """
    import yaml
    from mlflow.utils.environment import _mlflow_conda_env, _PythonEnv

    conda_env = _mlflow_conda_env(additional_pip_deps=pip_requirements, install_mlflow=False)
    with open(os.path.join(path, "conda.yaml"), "w") as stream:
        yaml.safe_dump(conda_env, stream=stream, default_flow_style=False)
    with open(os.path.join(path, "requirements.txt"), "w") as stream:
        stream.write("\n".join(pip_requirements))
    _PythonEnv.current().to_yaml(os.path.join(path, "python_env.yaml"))
