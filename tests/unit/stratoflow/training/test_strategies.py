from __future__ import annotations

import dataclasses

import pytest

from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import TrainingConfig


def test_every_description_names_a_builder_and_every_builder_is_named():
    from stratoflow.training import strategies

    assert {described.builder for described in STRATEGIES.values()} == set(strategies.BUILDERS)


@pytest.mark.parametrize(
    ("name", "replicas", "expected_type", "expected_replicas"),
    [
        ("one_device", 2, "OneDeviceStrategy", 1),
        ("auto", 2, "OneDeviceStrategy", 1),  # no GPU here: auto falls back to one device
        ("mirrored", 2, "MirroredStrategy", 2),
        ("mirrored", 1, "MirroredStrategy", 1),
    ],
)
def test_make_strategy(tf_runtime, name, replicas, expected_type, expected_replicas):
    from stratoflow.training.strategies import make_strategy

    strategy = make_strategy(TrainingConfig(strategy=name, replicas=replicas))
    assert type(strategy).__name__ == expected_type
    assert strategy.num_replicas_in_sync == expected_replicas


def test_mirrored_with_more_replicas_than_logical_cpus_is_refused(tf_runtime):
    from stratoflow.training.strategies import StrategyUnavailableError, make_strategy

    with pytest.raises(StrategyUnavailableError, match="replicas=4 needs 4 logical CPUs"):
        make_strategy(TrainingConfig(strategy="mirrored", replicas=4))


def test_unknown_strategy_names_the_allowed_ones(tf_runtime):
    from stratoflow.training.strategies import make_strategy

    bogus = dataclasses.replace(TrainingConfig(), strategy="bogus")
    with pytest.raises(ValueError, match="allowed: auto, one_device, mirrored"):
        make_strategy(bogus)


def test_required_logical_cpus():
    from stratoflow.training.strategies import required_logical_cpus

    assert required_logical_cpus(TrainingConfig(strategy="mirrored", replicas=4)) == 4
    assert required_logical_cpus(TrainingConfig(strategy="one_device", replicas=4)) == 1
