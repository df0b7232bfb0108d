"""TFDS builder `stratoflow_diabetes`: scikit-learn's diabetes data (442 patients), offline.

A pipeline's own dataset: `dataset.builder: "diabetes_dataset:StratoflowDiabetes"`. Ten numeric
columns (age, sex, body mass index, blood pressure, six blood serum measurements; mean-centred
and scaled by scikit-learn), and a float target: a measure of disease progression one year
later (25 to 346). Split 80/10/10 by a seed-fixed hash order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from stratoflow.api import seeded_order

SPLIT_SEED = 20261204
COLUMNS = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]


class StratoflowDiabetes(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's `load_diabetes()`: ten numeric columns, a float progression target."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": f"sklearn.datasets.load_diabetes(), 80/10/10, seed {SPLIT_SEED}."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Diabetes progression (Efron et al. 2004), as scikit-learn ships it.",
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.FeaturesDict({name: np.float32 for name in COLUMNS}),
                    "progression": tfds.features.Scalar(dtype=np.float32),
                }
            ),
            supervised_keys=("features", "progression"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#diabetes-dataset",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # offline: the data ships inside scikit-learn
        from sklearn.datasets import load_diabetes

        data = load_diabetes()
        order = seeded_order(range(len(data.target)), SPLIT_SEED)
        held = round(len(order) * 0.1)
        splits = {
            "validation": order[:held],
            "test": order[held : 2 * held],
            "train": order[2 * held :],
        }
        return {
            name: self._generate_examples(data.data, data.target, sorted(ids))
            for name, ids in splits.items()
        }

    def _generate_examples(
        self, values: np.ndarray, targets: np.ndarray, indices: list[int]
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for index in indices:
            columns = {name: float(values[index, k]) for k, name in enumerate(COLUMNS)}
            yield index, {"features": columns, "progression": float(targets[index])}
