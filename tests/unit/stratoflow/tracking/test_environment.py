"""`stratoflow.tracking.environment`: which TensorFlow build a served model must require; the
threads a training process records."""

from __future__ import annotations

import os
from importlib import metadata

from stratoflow.tracking.environment import intra_op_threads, tensorflow_distribution


def test_the_tensorflow_distribution_is_the_one_that_installed_the_tensorflow_package() -> None:
    # `tensorflow-cpu` on the base install, `tensorflow` on a gpu one: a registered model's
    # requirements name it, so its serving environment installs the build that trained it.
    # Its metadata may spell the name with "_" (`tensorflow_cpu`); pip and MLflow read both alike.
    owners = {
        name.replace("_", "-").lower() for name in metadata.packages_distributions()["tensorflow"]
    }
    assert tensorflow_distribution() in owners, owners


def test_a_run_records_the_intra_op_threads_its_launcher_gave_the_process(monkeypatch) -> None:
    # A launcher's share of the host's cores reaches TensorFlow as $TF_NUM_INTRAOP_THREADS;
    # without one, TensorFlow takes one thread per CPU the process may use.
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert intra_op_threads() == 3
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
    assert intra_op_threads() == len(os.sched_getaffinity(0))
