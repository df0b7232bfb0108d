"""Statistics of a prepared dataset's splits: what the data gate compares and a model builder reads.

One `DatasetStatistics` per run, computed once in the run's first task by streaming every split
(`stratoflow.data.profiling`), logged to the run's MLflow run (`data/statistics.json`, with a
readable `data/statistics.html`): the registered version's run holds the statistics of the data
it was trained on, so a later run compares its data with the champion's.

They describe the features as the model receives them (`stratoflow.data.datasets.load_split`:
images scaled to [0, 1], the pipeline's `dataset.preprocess` applied), per feature:

- numeric: count, missing (NaN or infinite), min, max, mean, standard deviation and the
  percentiles 0, 1, ..., 100 (exact up to `RESERVOIR_SIZE` values, from a seeded uniform sample
  of that size beyond);
- categorical: the vocabulary and each value's frequency (an id outside it counts as missing);
- image: the shape, the pixels' min, max, mean and standard deviation, and a histogram of the
  pixel values over [0, 1] (below and above counted apart);

and the label (the feature named `label`): the class frequencies (classification) or the
target's numeric statistics (regression).

Importing this module is cheap (no numpy, TensorFlow or MLflow): pipeline code gets these types
from `stratoflow.api`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NUMERIC = "numeric"
CATEGORICAL = "categorical"
IMAGE = "image"
KINDS = (NUMERIC, CATEGORICAL, IMAGE)
# The feature name of the label, or of the regression target.
LABEL = "label"
# Values kept per numeric feature for its percentiles: bounded memory whatever the split's size.
RESERVOIR_SIZE = 4096
# The run's statistics in its run folder: the first task writes it, the data gate and the
# training processes read it.
STATISTICS_FILE = "statistics.json"
# Bins of an image's pixel histogram over [0, 1], and one below and one above.
PIXEL_BINS = 20


@dataclass(frozen=True)
class FeatureStatistics:
    """One feature of one split (or its label).

    Attributes:
        name: the feature's name (`label` for the label or target).
        kind: `numeric`, `categorical` or `image`.
        count: the examples seen.
        missing: examples whose value is missing: NaN or infinite (numeric; an image with any
            such pixel), an id outside the vocabulary (categorical).
        min: numeric: the smallest value present; image: the smallest pixel.
        max: the largest.
        mean: the mean of the values present (image: of every pixel).
        std: their standard deviation (population).
        quantiles: numeric: the percentiles 0..100 (101 values) of the values present.
        vocabulary: categorical: the value names, index = id.
        frequencies: categorical: the examples of each value, in vocabulary order.
        shape: image: its shape (height, width, channels).
        histogram: image: the pixels in each of `PIXEL_BINS` equal bins of [0, 1], then the
            pixels below 0 and those above 1.
    """

    name: str
    kind: str
    count: int
    missing: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    quantiles: tuple[float, ...] = ()
    vocabulary: tuple[str, ...] = ()
    frequencies: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    histogram: tuple[int, ...] = ()

    @property
    def missing_share(self) -> float:
        """The share of examples with this feature missing (0 for an empty split)."""
        return self.missing / self.count if self.count else 0.0

    @property
    def variance(self) -> float | None:
        """`std` squared (what `keras.layers.Normalization(variance=...)` takes)."""
        return None if self.std is None else self.std**2

    def frequency_of(self) -> dict[str, int]:
        """Categorical: each value name → its examples."""
        return dict(zip(self.vocabulary, self.frequencies, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON types."""
        return {
            "name": self.name,
            "kind": self.kind,
            "count": self.count,
            "missing": self.missing,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "std": self.std,
            "quantiles": list(self.quantiles),
            "vocabulary": list(self.vocabulary),
            "frequencies": list(self.frequencies),
            "shape": list(self.shape),
            "histogram": list(self.histogram),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureStatistics:
        """Rebuild from `to_dict()` output.

        Raises:
            ValueError: an unknown kind, or a key missing.
        """
        if data["kind"] not in KINDS:
            raise ValueError(f"feature {data['name']!r}: kind {data['kind']!r} not in {KINDS}")

        def number(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            count=int(data["count"]),
            missing=int(data.get("missing", 0)),
            min=number("min"),
            max=number("max"),
            mean=number("mean"),
            std=number("std"),
            quantiles=tuple(float(q) for q in data.get("quantiles", ())),
            vocabulary=tuple(str(v) for v in data.get("vocabulary", ())),
            frequencies=tuple(int(f) for f in data.get("frequencies", ())),
            shape=tuple(int(d) for d in data.get("shape", ())),
            histogram=tuple(int(h) for h in data.get("histogram", ())),
        )


@dataclass(frozen=True)
class SplitStatistics:
    """One split's statistics: what a model builder that asks for `statistics` receives (of the
    training split).

    Attributes:
        role: `train`, `validation` or `test`.
        examples: how many examples the split holds.
        features: each feature's statistics by name (an image dataset's one feature: `image`).
        label: the label's (classification) or target's (regression) statistics.
        seconds: how long computing them took.
    """

    role: str
    examples: int
    features: dict[str, FeatureStatistics]
    label: FeatureStatistics
    seconds: float = 0.0

    def __getitem__(self, name: str) -> FeatureStatistics:
        """The statistics of feature `name`, e.g. `statistics["body_mass_g"].mean`.

        Raises:
            KeyError: no such feature; the message lists those there are.
        """
        if name not in self.features:
            raise KeyError(f"no feature {name!r}; the features are: {', '.join(self.features)}")
        return self.features[name]

    def to_dict(self) -> dict[str, Any]:
        """JSON types."""
        return {
            "role": self.role,
            "examples": self.examples,
            "features": [f.to_dict() for f in self.features.values()],
            "label": self.label.to_dict(),
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitStatistics:
        """Rebuild from `to_dict()` output."""
        features = [FeatureStatistics.from_dict(f) for f in data["features"]]
        return cls(
            role=str(data["role"]),
            examples=int(data["examples"]),
            features={f.name: f for f in features},
            label=FeatureStatistics.from_dict(data["label"]),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class DatasetStatistics:
    """Every split's statistics of one prepared dataset.

    Attributes:
        dataset: the TFDS name and version, e.g. `stratoflow_penguins:1.0.0`.
        fingerprint: the prepared files' fingerprint (`DatasetRef.fingerprint`).
        problem_type: `classification` or `regression`.
        splits: role → its statistics.
    """

    dataset: str
    fingerprint: str
    problem_type: str
    splits: dict[str, SplitStatistics] = field(default_factory=dict)

    @property
    def train(self) -> SplitStatistics:
        """The training split's statistics."""
        return self.splits["train"]

    @property
    def seconds(self) -> float:
        """How long computing every split took."""
        return sum(split.seconds for split in self.splits.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON types (the artifact `data/statistics.json`)."""
        return {
            "dataset": self.dataset,
            "fingerprint": self.fingerprint,
            "problem_type": self.problem_type,
            "splits": {role: split.to_dict() for role, split in self.splits.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetStatistics:
        """Rebuild from `to_dict()` output.

        Raises:
            ValueError: not statistics (a key missing or of the wrong kind).
        """
        try:
            return cls(
                dataset=str(data["dataset"]),
                fingerprint=str(data["fingerprint"]),
                problem_type=str(data["problem_type"]),
                splits={
                    str(role): SplitStatistics.from_dict(split)
                    for role, split in data["splits"].items()
                },
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not dataset statistics: {type(error).__name__}: {error}") from None
