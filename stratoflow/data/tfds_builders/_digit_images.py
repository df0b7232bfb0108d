"""The shape every bundled builder shares: labelled digit images, split 80/10/10 per class.

A builder names its source (`load_source`), its image shape, split seed, description and
homepage; this base gives TFDS the features, the splits (`stratoflow.data.splits`) and the
examples (`progress.split_examples`), so the bundled datasets share one encoding.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from stratoflow.data.splits import stratified_split
from stratoflow.data.tfds_builders.progress import split_examples

logger = logging.getLogger(__name__)


class DigitImagesBuilder(tfds.core.GeneratorBasedBuilder):
    """Images `IMAGE_SHAPE` uint8 and labels 0..9 from a source shipped in an installed package."""

    # Part of each builder's version: a different seed puts different digits in each split.
    SPLIT_SEED: ClassVar[int]
    IMAGE_SHAPE: ClassVar[tuple[int, int, int]]
    DESCRIPTION: ClassVar[str]
    HOMEPAGE: ClassVar[str]

    @abc.abstractmethod
    def load_source(self) -> tuple[np.ndarray, np.ndarray]:
        """All the examples: images `(n, *IMAGE_SHAPE)` uint8 and labels `(n,)` int64."""

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.DESCRIPTION,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=self.IMAGE_SHAPE),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
            homepage=self.HOMEPAGE,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # offline by design: the data ships inside an installed package
        images, labels = self.load_source()
        logger.info("%s: read %d digits from %s", self.name, len(labels), self.HOMEPAGE)
        return {
            name: self._generate_examples(name, images, labels, indices)
            for name, indices in stratified_split(labels.tolist(), self.SPLIT_SEED).items()
        }

    def _generate_examples(
        self, split: str, images: np.ndarray, labels: np.ndarray, indices: list[int]
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        # Keyed by the index in the source: stable across builds and library versions.
        return split_examples(self.name, split, images, labels, indices)
