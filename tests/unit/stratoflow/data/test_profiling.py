"""Statistics streamed from real prepared splits: the moments and percentiles agree with numpy
on the whole split, the memory they keep is bounded whatever the split's size, and every feature
kind (numeric, categorical, image, the label) is described."""

from __future__ import annotations

import numpy as np
import pytest

from stratoflow.config.features import NUMERIC, Column, Features, Target
from stratoflow.config.spec import load_spec
from stratoflow.data import profiling
from stratoflow.data.statistics import RESERVOIR_SIZE, DatasetStatistics


@pytest.fixture(scope="module")
def digits(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    return prepare_dataset(load_spec("digits").dataset)


@pytest.fixture(scope="module")
def penguins(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    spec = load_spec("penguins")
    return prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)


def test_tabular_statistics_agree_with_numpy_on_the_whole_split(penguins) -> None:
    from stratoflow.data.datasets import load_arrays

    statistics = profiling.dataset_statistics(penguins)
    columns, labels = load_arrays(penguins, "train")
    train = statistics.train

    assert set(statistics.splits) == {"train", "validation", "test"}
    assert train.examples == len(labels) == penguins.split_sizes["train"]
    mass = train["body_mass_g"]
    assert (mass.count, mass.missing) == (len(labels), 0)
    assert mass.mean == pytest.approx(float(np.mean(columns["body_mass_g"])), rel=1e-6)
    assert mass.std == pytest.approx(float(np.std(columns["body_mass_g"])), rel=1e-5)
    assert (mass.min, mass.max) == (columns["body_mass_g"].min(), columns["body_mass_g"].max())
    # Fewer values than the reservoir holds: the percentiles are exact.
    assert mass.quantiles[50] == pytest.approx(float(np.median(columns["body_mass_g"])))
    island = train["island"]
    assert island.vocabulary == ("Biscoe", "Dream", "Torgersen")
    assert list(island.frequencies) == np.bincount(columns["island"], minlength=3).tolist()
    assert train.label.frequency_of() == dict(
        zip(("Adelie", "Chinstrap", "Gentoo"), np.bincount(labels).tolist(), strict=True)
    )
    with pytest.raises(KeyError, match="no feature .bogus.; the features are: bill_depth_mm, "):
        train["bogus"]
    assert DatasetStatistics.from_dict(statistics.to_dict()) == statistics


def test_image_statistics_describe_shape_pixels_and_classes(digits) -> None:
    from stratoflow.data.datasets import load_arrays

    train = profiling.dataset_statistics(digits, roles=["train"]).train
    images, labels = load_arrays(digits, "train")
    image = train["image"]

    assert image.shape == (8, 8, 1) and image.count == len(images) and image.missing == 0
    assert image.mean == pytest.approx(float(images.mean()), rel=1e-5)
    assert image.std == pytest.approx(float(images.std()), rel=1e-4)
    assert sum(image.histogram) == images.size and image.histogram[-2:] == (0, 0)
    assert sum(train.label.frequencies) == len(labels) and len(train.label.vocabulary) == 10


def test_a_stream_longer_than_the_reservoir_keeps_bounded_memory_and_close_percentiles() -> None:
    """One pass over 200,000 values in batches: the sample stays RESERVOIR_SIZE values, the
    moments are exact and the percentiles within about a percentile of the truth."""
    rng = np.random.default_rng(7)
    values = rng.normal(10.0, 2.0, size=200_000).astype(np.float32)
    batches = (
        ({"x": values[i : i + 1000]}, np.zeros(1000, np.float32))
        for i in range(0, values.size, 1000)
    )
    accumulator_sizes = []
    original = profiling._Numeric._sample

    def watched(self, batch):  # how much the accumulator holds after each batch
        original(self, batch)
        accumulator_sizes.append(self.reservoir.size)

    profiling._Numeric._sample = watched
    try:
        split = profiling.split_statistics(
            batches, Features("tabular", columns=(Column("x", NUMERIC),)), Target("regression"), "t"
        )
    finally:
        profiling._Numeric._sample = original

    assert max(accumulator_sizes) == RESERVOIR_SIZE
    x = split["x"]
    assert x.count == values.size
    assert x.mean == pytest.approx(float(values.astype(np.float64).mean()), rel=1e-9)
    assert x.std == pytest.approx(float(values.astype(np.float64).std()), rel=1e-6)
    truth = np.quantile(values, [0.1, 0.5, 0.9])
    assert np.allclose([x.quantiles[10], x.quantiles[50], x.quantiles[90]], truth, atol=0.15)


def test_missing_values_are_counted_not_averaged() -> None:
    batch = {"x": np.array([1.0, np.nan, 3.0, np.inf], np.float32)}
    split = profiling.split_statistics(
        [(batch, np.zeros(4, np.float32))],
        Features("tabular", columns=(Column("x", NUMERIC),)),
        Target("regression"),
        "train",
    )

    assert (split["x"].count, split["x"].missing, split["x"].mean) == (4, 2, 2.0)
    assert split["x"].missing_share == 0.5


def test_large_images_are_read_in_batches_that_stay_under_the_byte_bound() -> None:
    assert profiling.batch_size(Features("tabular", columns=(Column("x", NUMERIC),))) == 1024
    assert profiling.batch_size(Features("image", shape=(28, 28, 1))) == 1024
    large = profiling.batch_size(Features("image", shape=(1024, 1024, 3)))
    assert large == 5 and large * 1024 * 1024 * 3 * 4 <= profiling.BATCH_BYTES
