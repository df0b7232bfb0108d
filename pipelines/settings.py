"""Where stratoflow keeps its local state, and which stores it talks to.

Every path and URI is resolved from the environment at call time (never at import time), so the
same code serves `make run` (a git-ignored `.stratoflow/` folder in the project), the tests (a
temporary folder) and a deployment (whatever the environment says).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

STATE_DIR_ENV = "STRATOFLOW_HOME"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DATA_DIR_ENV = "TFDS_DATA_DIR"
# A deployment's standing parameter-server cluster (JSON), used when a run's `cluster` is empty.
CLUSTER_ENV = "STRATOFLOW_CLUSTER"


def state_dir() -> Path:
    """The local state folder: `$STRATOFLOW_HOME`, else `<project>/.stratoflow`."""
    return Path(os.environ.get(STATE_DIR_ENV) or PROJECT_ROOT / ".stratoflow").resolve()


def tracking_uri() -> str:
    """The MLflow tracking (and registry) URI: `$MLFLOW_TRACKING_URI`, else SQLite in the state dir.

    Always explicit: MLflow's own default is relative to the current directory, and an Airflow
    task's current directory is not the user's.
    """
    return os.environ.get(TRACKING_URI_ENV) or f"sqlite:///{state_dir() / 'mlflow.db'}"


def artifact_root() -> Path:
    """Where a local (SQLite) tracking store keeps run artifacts."""
    return state_dir() / "mlartifacts"


def data_dir() -> Path:
    """The TFDS data dir: `$TFDS_DATA_DIR`, else `tensorflow_datasets/` in the state dir."""
    return Path(os.environ.get(DATA_DIR_ENV) or state_dir() / "tensorflow_datasets").resolve()


def standing_cluster() -> str:
    """`$STRATOFLOW_CLUSTER`: the standing parameter-server cluster of this deployment, or ""."""
    return os.environ.get(CLUSTER_ENV, "")


def run_dir(dag_id: str, run_id: str, state: Path | None = None) -> Path:
    """The run-scoped working folder (checkpoints, trained model, history) of one DAG run.

    Args:
        dag_id: the DAG id.
        run_id: the Airflow run id (made safe for a file name).
        state: the state folder; `state_dir()` by default.
    """
    safe_run_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return (state or state_dir()) / "runs" / dag_id / safe_run_id
