"""The names a pipeline's own code may import: `from stratoflow.api import Features, Target`.

This module is the whole promise to pipeline authors (bundled pipelines, `new-pipeline`'s
templates, a team's pipelines on `STRATOFLOW_PIPELINES_PATH`): the names in `__all__` keep their
meaning, or the changelog says what changed. Everything else in `stratoflow` is the engine's and
may move. import-linter holds the bundled `pipelines/` to it (pyproject.toml).

What pipeline code is handed, by contract (docs/reference/pipeline-code.md):

- a model builder, `model.builder: "module:build"`, is called as
  `build(features: Features, target: Target, **hyperparameters)` and returns an uncompiled
  Keras 3 model; a builder with a parameter `statistics` also receives the training split's
  statistics (`SplitStatistics`: means, standard deviations, vocabularies, ...) to set up its
  normalisation and lookup layers;
- a preprocessing function, `dataset.preprocess: "module:function"`, is a `tf.data` map function
  `function(features, target) -> (features, target)` on single examples, the features as
  the model builder gets them (`Features` says how), the target an int64 class id or float32;
- a TFDS builder, `dataset.builder: "module:Class"`, receives nothing from stratoflow;
  `seeded_order` and `stratified_split` give it seed-fixed splits that hold across machines
  and library versions.

Importing it is cheap (the standard library and two light engine modules, no TensorFlow, Keras,
TFDS or MLflow): a pipeline module can import it at the top.
"""

from __future__ import annotations

from stratoflow.config.features import (
    CATEGORICAL,
    CLASSIFICATION,
    IMAGE,
    NUMERIC,
    REGRESSION,
    TABULAR,
    Column,
    Features,
    Target,
)
from stratoflow.data.splits import SPLIT_FRACTIONS, seeded_order, stratified_split
from stratoflow.data.statistics import FeatureStatistics, SplitStatistics

__all__ = [
    "CATEGORICAL",
    "CLASSIFICATION",
    "IMAGE",
    "NUMERIC",
    "REGRESSION",
    "SPLIT_FRACTIONS",
    "TABULAR",
    "Column",
    "FeatureStatistics",
    "Features",
    "SplitStatistics",
    "Target",
    "seeded_order",
    "stratified_split",
]
