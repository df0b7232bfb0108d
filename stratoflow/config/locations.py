"""Where stratoflow keeps its local state, and which stores it talks to.

Every path and URI is resolved from the environment at call time (never at import time), so the
same code serves `make run` (a git-ignored `.stratoflow/` folder in the project), the tests (a
temporary folder) and a deployment (whatever the environment says).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import string
from pathlib import Path

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The DAG files every Airflow of this project parses (local runner, services stack, compose): the
# repository's `dags/`, which the package links as `stratoflow/dags/dag_files` so that an installed
# stratoflow has them too.
DAGS_FOLDER = (Path(__file__).parents[1] / "dags" / "dag_files").resolve()

STATE_DIR_ENV = "STRATOFLOW_HOME"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DATA_DIR_ENV = "TFDS_DATA_DIR"


def state_dir() -> Path:
    """The local state folder: `$STRATOFLOW_HOME`, else `<project>/.stratoflow` in a checkout,
    else `~/.stratoflow` (an installed stratoflow's project folder is site-packages)."""
    default = (
        PROJECT_ROOT / ".stratoflow"
        if (PROJECT_ROOT / "pyproject.toml").is_file()
        else Path.home() / ".stratoflow"
    )
    return Path(os.environ.get(STATE_DIR_ENV) or default).resolve()


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


def run_dir(dag_id: str, run_id: str, state: Path | None = None) -> Path:
    """The run-scoped working folder (checkpoints, trained model, history) of one DAG run.

    `<state>/runs/<dag folder>/<run folder>`, each name from `folder_name`: every DAG run gets a
    folder of its own, strictly inside its DAG's folder, whatever characters its run id holds.

    Args:
        dag_id: the DAG id.
        run_id: the Airflow run id.
        state: the state folder; `state_dir()` by default.
    """
    return (state or state_dir()) / "runs" / folder_name(dag_id) / folder_name(run_id)


def remove_run_dir(dag_id: str, run_id: str, part: str | None = None) -> bool:
    """Delete the folder of one DAG run (or its subfolder `part`), and nothing else.

    Refuses, with an error in the log, any folder that does not resolve strictly inside
    `runs/<dag folder>/` (a symlink or a name that escapes it): a clean-up must never take
    other runs' folders with it.

    Returns:
        True if the folder is gone (removed now or absent), False if it was refused.
    """
    dag_dir = (state_dir() / "runs" / folder_name(dag_id)).resolve()
    folder = run_dir(dag_id, run_id)
    if part is not None:
        folder = folder / part
    resolved = folder.resolve()
    if resolved == dag_dir or dag_dir not in resolved.parents or folder.is_symlink():
        logger.error(
            "not deleting %s: it does not resolve strictly inside %s (DAG %s, run %r)",
            folder,
            dag_dir,
            dag_id,
            run_id,
        )
        return False
    shutil.rmtree(resolved, ignore_errors=True)
    return not resolved.exists()


# Kept as they are in a folder name; everything else is escaped. No dot: "." and ".." never arise.
_PLAIN = frozenset(string.ascii_letters + string.digits + "_-")
# Below the 255 bytes most filesystems allow in a name, with room for the hash of a long one.
_MAX_NAME = 200


def folder_name(identifier: str) -> str:
    """The folder name of a DAG or run id: one-to-one, never "", ".", ".." or a path separator.

    Letters, digits, `_` and `-` stay as they are (`manual__2026-12-02T19:02:11+00:00` reads
    `manual__2026-12-02T19%3A02%3A11%2B00%3A00`); every other character becomes `%XX` per
    UTF-8 byte, `%` and `.` included, so two ids that differ map to names that differ. A name
    longer than 200 characters keeps its first 160 and ends with `~` and the SHA-256 of the id
    (`~` appears in no short name: it is escaped there).

    Raises:
        ValueError: `identifier` is empty (Airflow gives no run an empty id).
    """
    if not identifier:
        raise ValueError("an empty id has no folder")
    name = "".join(
        char
        if char in _PLAIN
        else "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
        for char in identifier
    )
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(identifier.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{name[:160]}~{digest}"
