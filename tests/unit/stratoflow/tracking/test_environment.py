"""`stratoflow.tracking.environment`: which TensorFlow build a served model must require."""

from __future__ import annotations

from importlib import metadata

from stratoflow.tracking.environment import tensorflow_distribution


def test_the_tensorflow_distribution_is_the_one_that_installed_the_tensorflow_package() -> None:
    # `tensorflow-cpu` on the base install, `tensorflow` on a gpu one: a registered model's
    # requirements name it, so its serving environment installs the build that trained it.
    # Its metadata may spell the name with "_" (`tensorflow_cpu`); pip and MLflow read both alike.
    owners = {
        name.replace("_", "-").lower() for name in metadata.packages_distributions()["tensorflow"]
    }
    assert tensorflow_distribution() in owners, owners
