"""The benchmarks' own state: a throwaway state folder and MLflow store; the TFDS data dir is
shared, so nothing is rebuilt."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from stratoflow.config import locations


def use_throwaway_state() -> Path:
    """Point this process (and the processes it starts) at a new temporary state folder, with
    its own SQLite MLflow store; returns the folder."""
    home = Path(tempfile.mkdtemp(prefix="stratoflow-bench-"))
    os.environ.update(
        {
            locations.DATA_DIR_ENV: str(locations.data_dir()),
            locations.STATE_DIR_ENV: str(home),
            locations.TRACKING_URI_ENV: f"sqlite:///{home / 'mlflow.db'}",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
    )
    return home
