"""Computing a prepared dataset's statistics in one streamed pass, in bounded memory.

Each split is read batch by batch through `load_split` (the features as the model gets them) and
folded into small accumulators: running moments (Chan et al.'s parallel update), a seeded uniform
reservoir of `RESERVOIR_SIZE` values per numeric feature for its percentiles, a count per
category, a fixed pixel histogram per image feature. Memory is a batch plus those, whatever the
split's size; the split is never held whole. numpy only: see docs/guide/statistics-and-data-gate.md
for why no statistics library.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from stratoflow.config.features import CATEGORICAL as CATEGORICAL_COLUMN
from stratoflow.config.features import CLASSIFICATION, TABULAR, Features, Target
from stratoflow.data.statistics import (
    CATEGORICAL,
    IMAGE,
    LABEL,
    NUMERIC,
    PIXEL_BINS,
    RESERVOIR_SIZE,
    DatasetStatistics,
    FeatureStatistics,
    SplitStatistics,
)

if TYPE_CHECKING:
    from stratoflow.data.datasets import DatasetRef

logger = logging.getLogger(__name__)

BATCH_SIZE = 1024
# A batch's decoded features stay under this many bytes (large images get smaller batches).
BATCH_BYTES = 64 << 20
PERCENTILES = np.linspace(0.0, 1.0, 101)
# The name of an image dataset's one feature.
IMAGE_FEATURE = "image"


class _Moments:
    """Count, mean, M2, min and max of a stream of values, merged a batch at a time."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = np.inf
        self.max = -np.inf

    def add(self, values: np.ndarray) -> None:
        n = int(values.size)
        if not n:
            return
        mean = float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    def into(self, statistics: FeatureStatistics) -> FeatureStatistics:
        """`statistics` with these moments' min, max, mean and std (None without values)."""
        if not self.n:
            return statistics
        return dataclasses.replace(
            statistics,
            min=self.min,
            max=self.max,
            mean=self.mean,
            std=float(np.sqrt(self.m2 / self.n)),
        )


class _Numeric:
    def __init__(self, name: str, seed: int, index: int) -> None:
        self.name = name
        self.count = 0
        self.missing = 0
        self.moments = _Moments()
        self.reservoir = np.empty(0, dtype=np.float64)
        self.seen = 0
        self.rng = np.random.default_rng([seed, index])

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        present = values[np.isfinite(values)]
        self.count += values.size
        self.missing += values.size - present.size
        self.moments.add(present)
        self._sample(present)

    def _sample(self, values: np.ndarray) -> None:
        room = RESERVOIR_SIZE - self.reservoir.size
        if room > 0:
            self.reservoir = np.concatenate([self.reservoir, values[:room]])
            self.seen += min(room, values.size)
            values = values[room:]
        if not values.size:
            return
        # Algorithm R, a batch at a time: the i-th value seen replaces a random slot with
        # probability RESERVOIR_SIZE / i.
        positions = self.seen + 1 + np.arange(values.size)
        slots = (self.rng.random(values.size) * positions).astype(np.int64)
        kept = slots < RESERVOIR_SIZE
        self.reservoir[slots[kept]] = values[kept]
        self.seen += values.size

    def finish(self) -> FeatureStatistics:
        quantiles = (
            tuple(float(q) for q in np.quantile(self.reservoir, PERCENTILES))
            if self.reservoir.size
            else ()
        )
        return self.moments.into(
            FeatureStatistics(
                name=self.name,
                kind=NUMERIC,
                count=self.count,
                missing=self.missing,
                quantiles=quantiles,
            )
        )


class _Categorical:
    def __init__(self, name: str, vocabulary: tuple[str, ...]) -> None:
        self.name = name
        self.vocabulary = vocabulary
        self.counts = np.zeros(len(vocabulary), dtype=np.int64)
        self.count = 0
        self.missing = 0

    def add(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids).reshape(-1).astype(np.int64)
        known = (ids >= 0) & (ids < len(self.vocabulary))
        self.count += ids.size
        self.missing += int(ids.size - known.sum())
        self.counts += np.bincount(ids[known], minlength=len(self.vocabulary))

    def finish(self) -> FeatureStatistics:
        return FeatureStatistics(
            name=self.name,
            kind=CATEGORICAL,
            count=self.count,
            missing=self.missing,
            vocabulary=self.vocabulary,
            frequencies=tuple(int(c) for c in self.counts),
        )


class _Image:
    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name = name
        self.shape = shape
        self.count = 0
        self.missing = 0
        self.moments = _Moments()
        self.histogram = np.zeros(PIXEL_BINS + 2, dtype=np.int64)
        self.edges = np.linspace(0.0, 1.0, PIXEL_BINS + 1)

    def add(self, images: np.ndarray) -> None:
        images = np.asarray(images, dtype=np.float64)
        flat = images.reshape(images.shape[0], -1)
        finite = np.isfinite(flat)
        self.count += flat.shape[0]
        self.missing += int((~finite.all(axis=1)).sum())
        pixels = flat[finite]
        self.moments.add(pixels)
        inside = (pixels >= 0.0) & (pixels <= 1.0)
        self.histogram[:PIXEL_BINS] += np.histogram(pixels[inside], bins=self.edges)[0]
        self.histogram[PIXEL_BINS] += int((pixels < 0.0).sum())
        self.histogram[PIXEL_BINS + 1] += int((pixels > 1.0).sum())

    def finish(self) -> FeatureStatistics:
        return self.moments.into(
            FeatureStatistics(
                name=self.name,
                kind=IMAGE,
                count=self.count,
                missing=self.missing,
                shape=self.shape,
                histogram=tuple(int(h) for h in self.histogram),
            )
        )


def split_statistics(
    batches: Iterable[tuple[Any, Any]],
    features: Features,
    target: Target,
    role: str,
    seed: int = 0,
) -> SplitStatistics:
    """Fold a stream of `(features, target)` numpy batches into one split's statistics.

    Args:
        batches: batches as `load_split(...).batch(n).as_numpy_iterator()` gives them: a dict of
            column arrays (tabular) or an image array, and the targets.
        features: what the batches' features are (`DatasetRef.features`).
        target: what the targets are.
        role: the split's role, for the result.
        seed: the reservoirs' seed, at least 0 (same seed, same percentiles).

    Raises:
        ValueError: a batch lacks a column `features` lists.
    """
    started = time.perf_counter()
    accumulators: dict[str, Any] = {}
    if features.kind == TABULAR:
        for index, column in enumerate(features.columns):
            accumulators[column.name] = (
                _Categorical(column.name, column.vocabulary)
                if column.kind == CATEGORICAL_COLUMN
                else _Numeric(column.name, seed, index)
            )
    else:
        accumulators[IMAGE_FEATURE] = _Image(IMAGE_FEATURE, tuple(features.shape))
    label: Any = (
        _Categorical(LABEL, target.class_names)
        if target.task == CLASSIFICATION
        else _Numeric(LABEL, seed, len(features.columns))
    )
    examples = 0
    for inputs, targets in batches:
        examples += len(targets)
        if features.kind == TABULAR:
            for name, accumulator in accumulators.items():
                if name not in inputs:
                    raise ValueError(f"the {role} batches have no column {name!r}")
                accumulator.add(inputs[name])
        else:
            accumulators[IMAGE_FEATURE].add(inputs)
        label.add(targets)
    return SplitStatistics(
        role=role,
        examples=examples,
        features={name: accumulator.finish() for name, accumulator in accumulators.items()},
        label=label.finish(),
        seconds=time.perf_counter() - started,
    )


def batch_size(features: Features) -> int:
    """Examples per batch read: `BATCH_SIZE`, fewer when that many images exceed `BATCH_BYTES`."""
    if features.kind == TABULAR:
        return BATCH_SIZE
    example_bytes = 4 * int(np.prod(features.shape))  # float32 pixels
    return max(1, min(BATCH_SIZE, BATCH_BYTES // example_bytes))


def dataset_statistics(
    dataset: DatasetRef, roles: Iterable[str] | None = None, seed: int = 0
) -> DatasetStatistics:
    """Stream every split (or `roles`) of a prepared dataset into its statistics.

    Runs the pipeline's `dataset.preprocess` (through `load_split`): call it where the pipeline's
    own code may run (the first task's child, a training process).
    """
    from stratoflow.data.datasets import load_split

    splits = {}
    size = batch_size(dataset.features)
    for role in roles if roles is not None else dataset.splits:
        batches = load_split(dataset, role).batch(size).as_numpy_iterator()
        splits[role] = split_statistics(batches, dataset.features, dataset.target, role, seed)
        logger.info(
            "statistics of the %s split: %d examples in %.2f s",
            role,
            splits[role].examples,
            splits[role].seconds,
        )
    return DatasetStatistics(
        dataset=f"{dataset.name}:{dataset.version}",
        fingerprint=dataset.fingerprint,
        problem_type=dataset.target.task,
        splits=splits,
    )
