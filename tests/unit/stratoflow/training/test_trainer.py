"""Training under each single-host strategy and loop, on the real digits data, in-process.

The pytest process has two logical CPUs (see `tf_runtime`), so `mirrored` runs two replicas here.
The model has no dropout: random layers draw differently per replica, which would make
one_device and mirrored legitimately differ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stratoflow.config.spec import ModelSpec, PipelineSpec, load_spec

EPOCHS = 2


def digits_spec(**training: object) -> PipelineSpec:
    spec = load_spec("digits")
    overrides = {"epochs": EPOCHS, "batch_size": 64, "learning_rate": 0.01, "seed": 7, **training}
    return dataclasses.replace(
        spec,
        model=ModelSpec("mlp", {"hidden_units": [64], "dropout": 0.0}),
        training=dataclasses.replace(spec.training, **overrides),
    )


@pytest.fixture(scope="module")
def digits(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    return prepare_dataset(load_spec("digits").dataset)


def run_training(digits, tmp_path: Path, **training: object):
    from stratoflow.training.trainer import train

    return train(digits_spec(**training), digits, tmp_path)


@pytest.fixture(scope="module")
def matrix(digits, tmp_path_factory):
    """Every (strategy, loop) pair trained once, shared by the assertions below."""
    return {
        (strategy, loop): run_training(
            digits, tmp_path_factory.mktemp(f"{strategy}-{loop}"), strategy=strategy, loop=loop
        )
        for strategy in ("one_device", "mirrored")
        for loop in ("custom", "fit")
    }


def losses(result) -> list[float]:
    return [entry["loss"] for entry in result.history]


@pytest.mark.parametrize("loop", ["custom", "fit"])
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_each_strategy_and_loop_learns(matrix, strategy, loop):
    result = matrix[(strategy, loop)]
    assert result.num_replicas == (2 if strategy == "mirrored" else 1)
    assert [entry["epoch"] for entry in result.history] == list(range(1, EPOCHS + 1))
    assert losses(result)[-1] < losses(result)[0]
    assert result.history[-1]["val_accuracy"] > 0.8
    assert all(entry["examples_per_second"] > 0 for entry in result.history)
    assert Path(result.model_path).is_file()


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_mirrored_matches_one_device(matrix, loop):
    one_device, mirrored = matrix[("one_device", loop)], matrix[("mirrored", loop)]
    assert losses(mirrored) == pytest.approx(losses(one_device), rel=1e-4)
    val_losses = [[entry["val_loss"] for entry in r.history] for r in (one_device, mirrored)]
    assert val_losses[1] == pytest.approx(val_losses[0], rel=1e-4)


def test_custom_loop_and_fit_see_the_same_data(matrix):
    # Same weights, same batches, same optimizer: the two loops agree to float rounding (measured
    # 7e-9 to 3e-8 relative per epoch); 1e-6 leaves room for another CPU's rounding, not more.
    custom, fit = matrix[("one_device", "custom")], matrix[("one_device", "fit")]
    assert losses(fit) == pytest.approx(losses(custom), rel=1e-6)


def test_same_seed_gives_the_same_result(matrix, digits, tmp_path):
    again = run_training(digits, tmp_path, strategy="one_device", loop="custom")
    assert losses(again) == losses(matrix[("one_device", "custom")])


def test_different_seed_gives_a_different_result(matrix, digits, tmp_path):
    other = run_training(digits, tmp_path, strategy="one_device", loop="custom", seed=8)
    assert losses(other) != losses(matrix[("one_device", "custom")])


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_resume_continues_at_the_next_epoch_exactly(digits, tmp_path, loop):
    uninterrupted = run_training(digits, tmp_path / "whole", epochs=3, loop=loop)
    first = run_training(digits, tmp_path / "split", epochs=1, loop=loop)
    resumed = run_training(digits, tmp_path / "split", epochs=3, loop=loop)
    assert first.resumed_from_epoch == 0 and resumed.resumed_from_epoch == 1
    assert [entry["epoch"] for entry in resumed.history] == [1, 2, 3]
    assert losses(resumed) == pytest.approx(losses(uninterrupted), rel=1e-6)


def test_batch_larger_than_the_training_split_is_refused(digits, tmp_path):
    with pytest.raises(ValueError, match="exceeds the .* training examples"):
        run_training(digits, tmp_path, batch_size=4096)


def test_tpu_is_refused_clearly_on_a_host_without_one(digits, tmp_path):
    from stratoflow.training.strategies import StrategyUnavailableError

    with pytest.raises(StrategyUnavailableError, match="needs a TPU.*choose one of: auto"):
        run_training(digits, tmp_path, strategy="tpu")
