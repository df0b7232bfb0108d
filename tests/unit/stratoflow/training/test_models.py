"""Statistics for the model builder: a builder with a `statistics` parameter gets the training
split's (the penguins' Normalization layers take their means and variances), from the run's file
in a training process, computed when no file is there; `statistics` is not a hyperparameter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import load_spec
from stratoflow.data.statistics import STATISTICS_FILE
from stratoflow.training.models import (
    build_model,
    build_pipeline_model,
    hyperparameter_names,
    resolve_builder,
    takes_statistics,
)


@pytest.fixture(scope="module")
def penguins(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    spec = load_spec("penguins")
    return spec, prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)


def normalization_means(model) -> dict[str, float]:
    return {
        layer.name.removeprefix("standardize_"): float(np.ravel(layer.mean)[0])
        for layer in model.layers
        if layer.name.startswith("standardize_")
    }


def test_the_penguins_model_standardises_with_the_training_splits_statistics(penguins) -> None:
    from stratoflow.data.datasets import load_arrays

    spec, dataset = penguins
    columns, _ = load_arrays(dataset, "train")
    model = build_pipeline_model(spec, dataset)  # no statistics given: computed from the split

    means = normalization_means(model)
    assert set(means) == {"bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"}
    for name, mean in means.items():
        assert mean == pytest.approx(float(np.mean(columns[name])), rel=1e-5), name
    builder = resolve_builder(spec.model.builder, spec.folder)
    assert takes_statistics(builder) and hyperparameter_names(builder) == ["hidden_units"]


def test_statistics_is_not_a_hyperparameter(penguins) -> None:
    spec, dataset = penguins
    with pytest.raises(SpecError, match="'statistics' is not a hyperparameter of 'model:build'"):
        build_model(
            spec.model.builder,
            dataset.features,
            dataset.target,
            {"statistics": None},
            spec.folder,
        )


@pytest.mark.integration
def test_a_training_process_builds_with_the_runs_statistics(penguins, tmp_path: Path) -> None:
    """The training process reads the statistics the first task wrote into the run folder (here
    with body_mass_g's mean changed to 1234 to tell them from the split's own)."""
    from stratoflow.data.profiling import dataset_statistics
    from stratoflow.training.trainer import train

    spec, dataset = penguins
    statistics = dataset_statistics(dataset).to_dict()
    for feature in statistics["splits"]["train"]["features"]:
        if feature["name"] == "body_mass_g":
            feature["mean"] = 1234.0
    (tmp_path / STATISTICS_FILE).write_text(json.dumps(statistics))
    short = dataclasses.replace(spec, training=dataclasses.replace(spec.training, epochs=1))

    result = train(short, dataset, tmp_path)

    import keras

    saved = keras.models.load_model(result.model_path)
    assert normalization_means(saved)["body_mass_g"] == 1234.0
