"""TFDS builder `stratoflow_penguins`: the Palmer penguins, read from the `palmerpenguins` package.

A pipeline's own dataset: `dataset.builder: "penguins_dataset:StratoflowPenguins"` in
`pipeline.yaml`. Importing this module registers the builder with TFDS under the snake_case of
the class name; `prepare_dataset` builds it offline from the CSV the package ships.

Features: `island` and `sex` (categorical; a missing sex is `unknown`), four measurements
(numeric); label: `species` (Adelie, Chinstrap, Gentoo). The two penguins without measurements
are left out (342 remain), split 80/10/10 per species by a seed-fixed hash order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from stratoflow.api import seeded_order

SPLIT_SEED = 20261204
SPECIES = ["Adelie", "Chinstrap", "Gentoo"]
ISLANDS = ["Biscoe", "Dream", "Torgersen"]
SEXES = ["female", "male", "unknown"]
MEASUREMENTS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


class StratoflowPenguins(tfds.core.GeneratorBasedBuilder):
    """The Palmer penguins (palmerpenguins' CSV), tabular, split 80/10/10 per species."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": f"palmerpenguins 0.1.x, rows with measurements, seed {SPLIT_SEED}."}

    def _info(self) -> tfds.core.DatasetInfo:
        columns: dict[str, Any] = {
            "island": tfds.features.ClassLabel(names=ISLANDS),
            "sex": tfds.features.ClassLabel(names=SEXES),
        }
        columns.update({name: np.float32 for name in MEASUREMENTS})
        return tfds.core.DatasetInfo(
            builder=self,
            description="Palmer Archipelago penguins (Gorman et al. 2014), palmerpenguins package.",
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.FeaturesDict(columns),
                    "species": tfds.features.ClassLabel(names=SPECIES),
                }
            ),
            supervised_keys=("features", "species"),
            homepage="https://allisonhorst.github.io/palmerpenguins/",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # offline: the CSV ships inside the palmerpenguins package
        from palmerpenguins import load_penguins

        frame = load_penguins().dropna(subset=MEASUREMENTS).reset_index(drop=True)
        frame["sex"] = frame["sex"].fillna("unknown")
        rows = frame.to_dict("records")
        splits: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
        for species in SPECIES:
            members = seeded_order(
                (i for i, row in enumerate(rows) if row["species"] == species), SPLIT_SEED
            )
            held = round(len(members) * 0.1)
            splits["validation"] += members[:held]
            splits["test"] += members[held : 2 * held]
            splits["train"] += members[2 * held :]
        return {name: self._generate_examples(rows, sorted(ids)) for name, ids in splits.items()}

    def _generate_examples(
        self, rows: list[dict[str, Any]], indices: list[int]
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for index in indices:
            row = rows[index]
            columns = {"island": row["island"], "sex": row["sex"]}
            columns.update({name: float(row[name]) for name in MEASUREMENTS})
            yield index, {"features": columns, "species": row["species"]}
