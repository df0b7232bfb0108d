"""`stratoflow_digits`: scikit-learn's 8x8 handwritten digits (1,797 images), built offline.

`sklearn.datasets.load_digits()` reads the copy bundled with scikit-learn (values 0..16); the
builder stores them as 8x8x1 uint8 images scaled to 0..255, so every image dataset in stratoflow
shares one encoding and one input scaling (divide by 255).
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow_datasets as tfds

from stratoflow.data.tfds_builders._digit_images import DigitImagesBuilder

logger = logging.getLogger(__name__)

# Part of version 1.0.0: a different seed puts different digits in each split.
SPLIT_SEED = 20240502
NUM_EXAMPLES = 1797
IMAGE_SHAPE = (8, 8, 1)


def load_source() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: images `(1797, 8, 8, 1)` uint8 in 0..255, labels `(1797,)` int64."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    values = np.asarray(digits.images)
    if values.shape != (NUM_EXAMPLES, 8, 8) or values.min() < 0 or values.max() > 16:
        raise ValueError(f"unexpected scikit-learn digits: shape {values.shape}, values 0..16")
    images = np.rint(values * 255.0 / 16.0).astype(np.uint8).reshape((-1, *IMAGE_SHAPE))
    return images, np.asarray(digits.target, dtype=np.int64)


class StratoflowDigits(DigitImagesBuilder):
    """scikit-learn's 1,797 8x8 digits, scaled to 0..255, split 80/10/10 per class."""

    SPLIT_SEED = SPLIT_SEED
    IMAGE_SHAPE = IMAGE_SHAPE
    DESCRIPTION = (
        "scikit-learn's optical recognition of handwritten digits (UCI), 1,797 8x8 "
        "images scaled from 0..16 to 0..255, split per class into train (80 %), "
        "validation (10 %) and test (10 %)."
    )
    HOMEPAGE = "https://scikit-learn.org/stable/modules/generated/sklearn.datasets.load_digits.html"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {
        "1.0.0": (
            "Initial release: sklearn.datasets.load_digits(), 8x8x1 uint8 images scaled "
            "round(v * 255 / 16), stratified train/validation/test = 80/10/10 % per class, "
            f"seed {SPLIT_SEED}."
        ),
    }

    def load_source(self) -> tuple[np.ndarray, np.ndarray]:
        return load_source()
