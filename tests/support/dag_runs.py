"""`airflow dags test` with the run id and run type chosen, and what the run left in Airflow.

`airflow dags test` makes up its run id and always creates a manual run. `dags_test` runs the
same CLI with two things replaced before it starts (`DagRun.generate_run_id`, and the run type
`SerializedDAG.create_dagrun` receives), as a REST trigger with `dag_run_id` would choose the id,
and as the scheduler (`scheduled`) or an asset event (`asset_triggered`) would create the run.
"""

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

_DAGS_TEST_AS = textwrap.dedent(
    """
    import functools
    import sys
    from airflow.models.dagrun import DagRun
    from airflow.serialization.definitions.dag import SerializedDAG
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    run_id, run_type = sys.argv.pop(1), DagRunType(sys.argv.pop(1))
    DagRun.generate_run_id = staticmethod(lambda **_: run_id)
    if run_type is not DagRunType.MANUAL:
        by = {
            DagRunType.SCHEDULED: DagRunTriggeredByType.TIMETABLE,
            DagRunType.ASSET_TRIGGERED: DagRunTriggeredByType.ASSET,
        }[run_type]
        create = SerializedDAG.create_dagrun

        @functools.wraps(create)
        def create_as(self, *args, **kwargs):
            kwargs.update(run_type=run_type, triggered_by=by, triggering_user_name=None)
            return create(self, *args, **kwargs)

        SerializedDAG.create_dagrun = create_as
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
    task_states: dict[str, str]  # task id -> its final state

    def xcom(self, dag_id: str, task_id: str, key: str) -> Any:
        """A task's XCom value in this run (JSON), or None."""
        home = airflow_setup.airflow_home()
        with sqlite3.connect(home / "airflow.db") as connection:
            row = connection.execute(
                "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND "
                "key = ?",
                (dag_id, self.run_id, task_id, key),
            ).fetchone()
        return None if row is None else json.loads(row[0])


def dags_test(
    dag_id: str,
    conf: dict[str, Any],
    run_id: str,
    run_type: str = "manual",
    mark_success: str | None = None,
) -> DagTest:
    """`airflow dags test DAG_ID -c CONF` as run `run_id` of type `run_type`: its output,
    duration, tries and task states.

    `mark_success`: a regex of task ids that Airflow marks successful instead of running them
    (`--mark-success-pattern`), for a test that needs only the tasks before them.
    """
    home = airflow_setup.airflow_home()
    env = airflow_setup.airflow_env(home)
    airflow_setup.ensure_airflow_db(home, env)
    command = [sys.executable, "-c", _DAGS_TEST_AS, run_id, run_type, "dags", "test", dag_id]
    if mark_success is not None:
        command += ["--mark-success-pattern", mark_success]
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
        rows = connection.execute(
            "SELECT task_id, try_number, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        ).fetchall()
    tries = {task: tried for task, tried, _ in rows if tried > 0}
    states = {task: task_state for task, _, task_state in rows}
    log.info(
        "dags test %s %r %s %s: %s in %.1f s, tasks %s",
        dag_id,
        run_id,
        run_type,
        conf,
        state,
        seconds,
        states,
    )
    return DagTest(
        run_id, result.returncode, result.stdout + result.stderr, seconds, state, tries, states
    )
