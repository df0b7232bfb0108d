"""Airflow's own floor: `airflow dags test` of a DAG whose tasks do nothing.

The orchestration overhead of a stratoflow run (its wall time outside its tasks) is measured
beside the same command on a DAG of as many chained tasks that return at once, in a DAGs folder
of its own, with the same Airflow home and settings: the CLI's start, the parse, the DAG run's
creation, the in-process execution API that `dags test` builds for the first task, and the exit.
Each task freezes the heap as stratoflow's steps do (`run_context.freezes_heap`): otherwise the
interpreter's last collection over Airflow's objects adds about 2 s to the exit. What a
stratoflow run spends outside its tasks beyond this is stratoflow's.
"""

from __future__ import annotations

import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stratoflow.services import airflow_setup

DAG_ID = "airflow_floor"

DAG_FILE = """
import pendulum
from airflow.sdk import dag, task

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def airflow_floor():
    previous = None
    for number in range({tasks}):
        @task(task_id=f"task_{{number}}")
        def nothing():
            import gc

            gc.freeze()
        current = nothing()
        if previous is not None:
            previous >> current
        previous = current

airflow_floor()
"""


def measure(home: Path, env: Mapping[str, str], tasks: int) -> dict[str, Any]:
    """`airflow dags test` of a DAG of `tasks` empty tasks in Airflow home `home` (its metadata
    DB already made): its wall time and each task's duration as Airflow recorded it."""
    with tempfile.TemporaryDirectory(prefix="stratoflow-floor-") as folder:
        (Path(folder) / "airflow_floor.py").write_text(DAG_FILE.format(dag_id=DAG_ID, tasks=tasks))
        command = airflow_setup.airflow_command("dags", "test", DAG_ID)
        started = time.perf_counter()
        subprocess.run(
            command,
            env={**env, "AIRFLOW__CORE__DAGS_FOLDER": folder},
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - started
    return {"wall_seconds": wall, "task_seconds": task_durations(home, DAG_ID)}


def task_durations(home: Path, dag_id: str) -> dict[str, float]:
    """Each task's duration in the newest run of DAG `dag_id`, as Airflow recorded it in the
    SQLite metadata DB of Airflow home `home`."""
    with sqlite3.connect(home / "airflow.db") as db:
        return dict(
            db.execute(
                "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND run_id = "
                "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
                (dag_id, dag_id),
            ).fetchall()
        )
