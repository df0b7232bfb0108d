"""Session-wide test setup: an isolated state folder, stores and Airflow home for the whole run.

Everything a test writes goes under one temporary STRATOFLOW_HOME. The TFDS data dir is shared by
the session so each bundled dataset is built once. The pytest process splits its CPU into two
logical devices before TensorFlow runs any op, so `mirrored` tests get two replicas in-process.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="stratoflow-tests-"))

# Set before any project, TensorFlow, MLflow or Airflow import reads them.
os.environ.update(
    {
        "STRATOFLOW_HOME": str(_SESSION_HOME),
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SESSION_HOME / 'mlflow.db'}",
        "TFDS_DATA_DIR": str(_SESSION_HOME / "tensorflow_datasets"),
        "AIRFLOW_HOME": str(_SESSION_HOME / "airflow"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GIT_PYTHON_REFRESH": "quiet",
    }
)

TEST_LOGICAL_CPUS = 2


@pytest.fixture(scope="session")
def session_home() -> Path:
    return _SESSION_HOME


@pytest.fixture(scope="session")
def tf_runtime():
    """TensorFlow in the pytest process, with two logical CPUs (must precede any TF op)."""
    from tasks.strategies import configure_host_devices

    configure_host_devices(TEST_LOGICAL_CPUS)
    import tensorflow as tf

    return tf


def fresh_mlflow_client(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[object]:
    """For a module-scoped fixture: an MlflowClient on a new SQLite store, set as the tracking
    URI (so Airflow subprocesses started meanwhile use it too) until the fixture ends."""
    from pipelines import settings
    from tasks import tracking

    store = tmp_path_factory.mktemp(name) / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield tracking.client()


# Fixtures for tests that start processes (tests/processes.py).
from tests.processes import child_watcher, private_tmpdir  # noqa: E402, F401
