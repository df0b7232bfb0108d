"""An Airflow installation run as local processes: its home, environment and metadata DB.

The local runner (`make run`, SQLite) and the services stack (PostgreSQL) both start Airflow
commands as subprocesses; this module gives them one environment and one migration step, so
both see this repository's DAGs and stratoflow's stores the same way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

from stratoflow.config import locations
from stratoflow.services.file_modes import OWNER_ONLY_UMASK, private_folder
from stratoflow.services.state_files import last_lines, write_private_text

log = logging.getLogger(__name__)

# Tasks run one at a time under `dags test`; a small pool keeps other Airflow commands lean.
PARALLELISM = 4


class AirflowSetupError(RuntimeError):
    """An Airflow set-up command (the metadata DB migration) failed; the message quotes it."""


def airflow_home() -> Path:
    """The runner's Airflow home: `airflow/` in the state folder."""
    return locations.state_dir() / "airflow"


def airflow_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an Airflow command that uses Airflow home `home` and this repo's DAGs.

    Args:
        home: the Airflow home (config, SQLite metadata DB `airflow.db`, logs).
        base: the environment to extend; the current process's by default.

    Returns:
        `base` plus the Airflow settings (home, metadata DB, DAGs folder, no example DAGs, small
        parallelism) and stratoflow's stores, all explicit: a task's current directory is not
        the user's, so nothing may rely on relative defaults.
    """
    env = dict(os.environ if base is None else base)
    python_path = [str(locations.PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(locations.DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(PARALLELISM),
            locations.STATE_DIR_ENV: str(locations.state_dir()),
            locations.TRACKING_URI_ENV: locations.tracking_uri(),
            locations.DATA_DIR_ENV: str(locations.data_dir()),
            "PYTHONPATH": os.pathsep.join(python_path),
        }
    )
    return env


def airflow_command(*args: str) -> list[str]:
    """The command line running `airflow ARGS` with this interpreter's Airflow."""
    return [sys.executable, "-m", "airflow", *args]


def ensure_airflow_db(
    home: Path, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> bool:
    """Create or upgrade the metadata DB of Airflow home `home` unless it is current.

    A stamp file in `home` records the Airflow version the DB was migrated with; `airflow db
    migrate` (tens of seconds) runs only when the DB is missing or Airflow changed. `home` and
    what the migration writes (a SQLite DB, `airflow.cfg`) are their owner's only.

    Args:
        home: the Airflow home.
        env: the environment of the migration; `airflow_env(home)` by default. Its
            `AIRFLOW__DATABASE__SQL_ALCHEMY_CONN` may name any database (SQLite, PostgreSQL).
        timeout: fail if the migration takes longer (seconds).

    Returns:
        True if it migrated, False if the DB was already current.

    Raises:
        AirflowSetupError: the migration failed.
    """
    stamp = home / ".stratoflow-db-migrated"
    wanted = version("apache-airflow")
    env = dict(env) if env is not None else airflow_env(home)
    sqlite = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:")
    present = (home / "airflow.db").is_file() if sqlite else True
    if present and stamp.is_file() and stamp.read_text() == wanted:
        return False
    private_folder(home)
    log.info("Initialising the Airflow metadata DB of %s (airflow db migrate)", home)
    try:
        result = subprocess.run(
            airflow_command("db", "migrate"),
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            umask=OWNER_ONLY_UMASK,
        )
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"") + (expired.stderr or b"")
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        raise AirflowSetupError(
            f"airflow db migrate ran past {timeout:.0f} s:\n{last_lines(text)}"
        ) from None
    if result.returncode:
        raise AirflowSetupError(
            f"airflow db migrate failed (exit code {result.returncode}):\n"
            f"{last_lines(result.stdout + result.stderr)}"
        )
    write_private_text(stamp, wanted)
    return True
