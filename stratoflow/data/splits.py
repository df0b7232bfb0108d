"""Seed-fixed train/validation/test splits for TFDS builders (the bundled ones and pipelines').

The order comes from `sha256(f"{seed}:{index}")`, not from a NumPy generator, whose streams NumPy
does not promise to keep across releases: the same seed gives the same splits with any library
version. The seed is part of a builder's version: changing it (or the fractions) changes which
example lands in which split, so it needs a new dataset version.

Light: the standard library only (pipeline code reaches it through `stratoflow.api`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

# (split name, fraction of each class); the first split takes what rounding leaves.
SPLIT_FRACTIONS: tuple[tuple[str, float], ...] = (
    ("train", 0.8),
    ("validation", 0.1),
    ("test", 0.1),
)


def seeded_order(indices: Iterable[int], seed: int) -> list[int]:
    """`indices` in a seed-fixed pseudo-random order, the same on every machine and release.

    Each index's place depends only on the index and the seed, so a subset keeps the order it
    has within the whole: the members of one class come out as they would among all examples.

    Args:
        indices: example indices (`range(n)`, or the indices of one class).
        seed: the permutation seed (part of the dataset version).

    Returns:
        The indices, ordered by `sha256(f"{seed}:{index}")`.
    """
    return sorted(indices, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())


def stratified_split(labels: Sequence[int], seed: int) -> dict[str, list[int]]:
    """Assign every example index to a split, class by class, from a seed-fixed order.

    Args:
        labels: the class label of each example, by example index.
        seed: the permutation seed (part of the dataset version).

    Returns:
        Split name → sorted example indices; each class is split 80 % / 10 % / 10 % in
        `seeded_order` (validation and test rounded, train takes the rest, first).
    """
    by_class: dict[int, list[int]] = {}
    for index in seeded_order(range(len(labels)), seed):
        by_class.setdefault(int(labels[index]), []).append(index)

    splits: dict[str, list[int]] = {name: [] for name, _ in SPLIT_FRACTIONS}
    for members in by_class.values():
        sizes = [round(len(members) * fraction) for _, fraction in SPLIT_FRACTIONS[1:]]
        sizes.insert(0, len(members) - sum(sizes))
        start = 0
        for (name, _), size in zip(SPLIT_FRACTIONS, sizes, strict=True):
            splits[name].extend(members[start : start + size])
            start += size
    return {name: sorted(indices) for name, indices in splits.items()}
