"""`stratoflow new-pipeline`: write a working pipeline folder to start from.

The default template (`starter`) is a pipeline with code of its own: `model.py` (a model builder
by import path) and `preprocess.py` (a `tf.data` map function), training on scikit-learn's
bundled digits so it runs offline at once. `--from EXAMPLE` copies a bundled pipeline instead
(`mnist`, `digits`, `penguins`, `diabetes`), registered under the new name.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from stratoflow.config import discovery
from stratoflow.config.parsing import SpecError

STARTER = "starter"

_STARTER_YAML = """\
# {name}: a pipeline of its own. Edit freely; `stratoflow run {name}` retrains it once.
description: {name}, scikit-learn's 8x8 digits with this folder's model and preprocessing.
task: classification            # or regression (float targets; evaluation.metric test_mae)
dataset:
  name: stratoflow_digits       # any TFDS name; or builder: "my_dataset:MyDataset";
  version: 1.0.0                # or image_folder: images + image_shape: [h, w, c]
  preprocess: "preprocess:preprocess"
model:
  builder: "model:build"        # build(features, target, **hyperparameters) in model.py
  hyperparameters: {{hidden_units: [64], dropout: 0.0}}
optimizer: {{name: adam}}         # any Keras optimizer by name, with its arguments
training:
  epochs: 10
  batch_size: 32
  learning_rate: 0.003
evaluation:                     # what a new model must pass to become champion
  metrics:                      # each against its bound and the champion's value
    - {{metric: test_accuracy, min: 0.85, max_regression: 0.02}}
    - {{metric: test_loss, max: 0.6, max_regression: 0.1}}
  slices:                       # each class's accuracy against the champion's same class
    per_class: true
    max_regression: 0.12
    min_examples: 10            # smaller slices are reported, not gated
validation:                     # the data gate before training, against the champion's data
  distance: psi                 # or js; drift bound: max_drift, or drift: {{feature: bound}}
  max_missing: 0.05             # share of missing values allowed per feature
  ranges: {{image: {{min: -0.5, max: 0.5}}}}  # after preprocess.py: pixels - 0.5
registered_model: {name}
schedule: null                  # a cron (UTC), or only on its dataset's refresh
owner: {name}
tags: [{name}]
retries: 1
retry_delay_seconds: 30
"""

_STARTER_MODEL = '''"""The model of pipeline {name} (`model.builder: "model:build"`)."""

from __future__ import annotations

from collections.abc import Sequence

import keras

# stratoflow.api is what pipeline code may import from stratoflow; the rest is the engine's.
from stratoflow.api import Features, Target


def build(
    features: Features,
    target: Target,
    hidden_units: Sequence[int] = (64,),
    dropout: float = 0.0,
) -> keras.Model:
    """An uncompiled Keras model: the features in, `target.num_outputs` values out.

    Image features are one tensor of shape `features.shape` in [0, 1]; tabular features a dict
    of scalar columns (`features.columns`). Classification wants logits (one per class, no
    softmax), regression the predictions. Every keyword argument is a hyperparameter that
    pipeline.yaml may set.
    """
    inputs = keras.Input(shape=features.shape)
    x = keras.layers.Flatten()(inputs)
    for width in hidden_units:
        x = keras.layers.Dense(width, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, keras.layers.Dense(target.num_outputs)(x), name="{name}")
'''

_STARTER_PREPROCESS = '''"""The preprocessing of pipeline {name} (`dataset.preprocess`)."""

from __future__ import annotations

from typing import Any


def preprocess(features: Any, target: Any) -> tuple[Any, Any]:
    """A `tf.data` map function over every (features, target) pair of every split.

    It runs in training, validation and evaluation alike (not in the served model: send the
    served model features as they are after this function). Here: pixels centred on 0.
    """
    return features - 0.5, target
'''


def examples() -> list[str]:
    """The templates `new_pipeline` can start from: `starter` and the bundled pipelines."""
    bundled = sorted(p.name for p in discovery.BUNDLED_DIR.iterdir() if _is_pipeline(p))
    return [STARTER, *bundled]


def default_dir() -> Path:
    """Where a new pipeline goes: the first `STRATOFLOW_PIPELINES_PATH` entry, else `.`."""
    roots = discovery.pipeline_roots()[1:]
    return roots[0] if roots else Path.cwd()


def new_pipeline(name: str, example: str = STARTER, directory: Path | None = None) -> Path:
    """Write pipeline folder `directory/name` from `example`.

    Raises:
        SpecError: an invalid name, an unknown example, or the folder exists already.
    """
    if not discovery.NAME_PATTERN.match(name):
        raise SpecError(
            f"pipeline name {name!r} is not valid: a letter, then letters, digits or '_'"
        )
    if example not in examples():
        raise SpecError(f"unknown example {example!r}; allowed: {', '.join(examples())}")
    folder = (directory or default_dir()).expanduser().resolve() / name
    if folder.exists():
        raise SpecError(f"{folder} exists already; choose another name or --dir")
    if example == STARTER:
        folder.mkdir(parents=True)
        (folder / discovery.PIPELINE_FILE).write_text(_STARTER_YAML.format(name=name))
        (folder / "model.py").write_text(_STARTER_MODEL.format(name=name))
        (folder / "preprocess.py").write_text(_STARTER_PREPROCESS.format(name=name))
        return folder
    shutil.copytree(
        discovery.BUNDLED_DIR / example,
        folder,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    spec = folder / discovery.PIPELINE_FILE
    text = re.sub(r"(?m)^registered_model: .*$", f"registered_model: {name}", spec.read_text())
    spec.write_text(text)
    return folder


def _is_pipeline(path: Path) -> bool:
    return (path / discovery.PIPELINE_FILE).is_file()
