"""How far one split's distribution of a feature moved from a reference's: PSI or Jensen-Shannon.

Both compare two distributions over the same bins, computed from statistics alone (no data is
read again): a numeric feature's bins are the reference's deciles, and each side's share of a bin
comes from its own percentiles; a categorical feature's (or the labels') bins are its values; an
image's are the pixel histogram's bins.

- `psi`: population stability index, sum of (new - ref) * ln(new / ref) over the bins (shares
  floored at `FLOOR`); read as < 0.1 stable, 0.1-0.25 moderate, > 0.25 a major shift.
- `js`: Jensen-Shannon distance, base 2: the square root of the divergence, in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stratoflow.data.statistics import CATEGORICAL, IMAGE, FeatureStatistics

# The smallest share a bin is given for PSI: an empty bin would make the index infinite.
FLOOR = 1e-4
DECILES = 10


def psi(reference: Sequence[float], new: Sequence[float]) -> float:
    """Population stability index of two distributions over the same bins (shares, sum 1)."""
    total = 0.0
    for ref, now in zip(reference, new, strict=True):
        ref, now = max(ref, FLOOR), max(now, FLOOR)
        total += (now - ref) * math.log(now / ref)
    return total


def jensen_shannon(reference: Sequence[float], new: Sequence[float]) -> float:
    """Jensen-Shannon distance (base 2, in [0, 1]) of two distributions over the same bins."""
    divergence = 0.0
    for ref, now in zip(reference, new, strict=True):
        middle = (ref + now) / 2
        if ref > 0:
            divergence += ref * math.log2(ref / middle) / 2
        if now > 0:
            divergence += now * math.log2(now / middle) / 2
    return math.sqrt(max(divergence, 0.0))


DISTANCE_FUNCTIONS = {"psi": psi, "js": jensen_shannon}


def distance(name: str, reference: FeatureStatistics, new: FeatureStatistics) -> float | None:
    """The distance `name` (`psi` or `js`) of `new`'s distribution from `reference`'s.

    Returns:
        None when the two cannot be compared (different kinds or vocabularies, no values on a
        side): the schema check reports those.
    """
    shares = binned(reference, new)
    if shares is None:
        return None
    return DISTANCE_FUNCTIONS[name](*shares)


def binned(
    reference: FeatureStatistics, new: FeatureStatistics
) -> tuple[list[float], list[float]] | None:
    """Both sides' shares over the bins of `reference` (see the module's docstring), or None."""
    if reference.kind != new.kind:
        return None
    if reference.kind == CATEGORICAL:
        if reference.vocabulary != new.vocabulary:
            return None
        return _shares(reference.frequencies), _shares(new.frequencies)
    if reference.kind == IMAGE:
        if len(reference.histogram) != len(new.histogram):
            return None
        return _shares(reference.histogram), _shares(new.histogram)
    if not reference.quantiles or not new.quantiles:
        return None
    edges = sorted(set(reference.quantiles[DECILES:-DECILES:DECILES]))
    return _decile_shares(reference.quantiles, edges), _decile_shares(new.quantiles, edges)


def _shares(counts: Sequence[int]) -> list[float]:
    total = sum(counts)
    return [count / total if total else 0.0 for count in counts]


def _cdf(quantiles: Sequence[float], x: float) -> float:
    """The share of values at most `x`, read from the percentiles 0..100."""
    below = sum(1 for q in quantiles if q <= x)
    return below / len(quantiles)


def _decile_shares(quantiles: Sequence[float], edges: Sequence[float]) -> list[float]:
    """Shares of the bins (-inf, e1], (e1, e2], ..., (ek, inf) of a feature with `quantiles`."""
    cumulative = [0.0, *(_cdf(quantiles, edge) for edge in edges), 1.0]
    return [high - low for low, high in zip(cumulative, cumulative[1:], strict=False)]
