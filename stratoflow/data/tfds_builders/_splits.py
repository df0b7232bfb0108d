"""The stratified, fixed-seed train/validation/test split shared by the bundled builders.

The seed is part of each builder's version: changing it (or the fractions) changes which example
lands in which split, so it needs a new dataset version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# (split name, fraction of each class); the last split takes what rounding leaves.
SPLIT_FRACTIONS: tuple[tuple[str, float], ...] = (
    ("train", 0.8),
    ("validation", 0.1),
    ("test", 0.1),
)


def stratified_split(labels: Sequence[int], seed: int) -> dict[str, list[int]]:
    """Assign every example index to a split, class by class, from a seed-fixed permutation.

    The permutation orders indices by `sha256(f"{seed}:{index}")` rather than by a NumPy
    generator, whose streams NumPy does not promise to keep across releases: the same seed gives
    the same splits with any library version.

    Args:
        labels: the class label of each example, by example index.
        seed: the permutation seed (part of the dataset version).

    Returns:
        Split name → sorted example indices; each class is split 80 % / 10 % / 10 %
        (validation and test rounded, train takes the rest).
    """
    order = sorted(
        range(len(labels)),
        key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest(),
    )
    by_class: dict[int, list[int]] = {}
    for index in order:
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
