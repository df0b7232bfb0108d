"""`airflow dags test` of one DAG with a chosen run id, as the integration tests run a DAG."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any

from stratoflow.services import airflow_setup

log = logging.getLogger(__name__)

# `airflow dags test` makes up its run id; this runs the same CLI with the id chosen instead
# (only `DagRun.generate_run_id` is replaced), as a REST trigger with `dag_run_id` would.
_DAGS_TEST_WITH_RUN_ID = textwrap.dedent(
    """
    import sys
    from airflow.models.dagrun import DagRun

    run_id = sys.argv.pop(1)
    DagRun.generate_run_id = staticmethod(lambda **_: run_id)
    from airflow.__main__ import main

    sys.argv[0] = "airflow"
    main()
    """
)


@dataclass(frozen=True)
class DagTest:
    run_id: str
    returncode: int
    output: str
    seconds: float
    state: str
    tries: dict[str, int]  # task id -> tries recorded (1 = no retry)


def dags_test(dag_id: str, conf: dict[str, Any], run_id: str) -> DagTest:
    """`airflow dags test DAG_ID -c CONF` for run `run_id`: its output, duration and tries."""
    home = airflow_setup.airflow_home()
    env = airflow_setup.airflow_env(home)
    airflow_setup.ensure_airflow_db(home, env)
    command = [sys.executable, "-c", _DAGS_TEST_WITH_RUN_ID, run_id, "dags", "test", dag_id]
    started = time.monotonic()
    result = subprocess.run(
        [*command, "-c", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    seconds = time.monotonic() - started
    with sqlite3.connect(home / "airflow.db") as connection:
        (state,) = connection.execute(
            "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
        ).fetchone()
        tries = dict(
            connection.execute(
                "SELECT task_id, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? "
                "AND try_number > 0",
                (dag_id, run_id),
            ).fetchall()
        )
    log.info(
        "dags test %s %r %s: %s in %.1f s, tries %s", dag_id, run_id, conf, state, seconds, tries
    )
    return DagTest(run_id, result.returncode, result.stdout + result.stderr, seconds, state, tries)
