"""The bundled builders' example generator, logging its progress while TFDS writes a split."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

# A line per this many examples written, and one when the split is done.
LOG_EVERY = 1000


def split_examples(
    dataset: str, split: str, images: np.ndarray, labels: np.ndarray, indices: Sequence[int]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The examples of one split, keyed by their index in the source data (stable across builds).

    Logs `<dataset> <split>: n/total examples` every `LOG_EVERY` examples and at the end.
    """
    total = len(indices)
    started = time.monotonic()
    for done, index in enumerate(indices, start=1):
        yield index, {"image": images[index], "label": int(labels[index])}
        if done % LOG_EVERY == 0 or done == total:
            logger.info(
                "%s %s: %s/%s examples (%.1f s)",
                dataset,
                split,
                f"{done:,}",
                f"{total:,}",
                time.monotonic() - started,
            )
