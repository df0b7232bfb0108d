"""DAG runs of an Airflow home read and changed through Airflow's own Python API, not raw SQL.

The local runner has no API server. Each call here runs `python -m stratoflow.services.airflow_runs`
in the Airflow environment of the home (`airflow_setup.airflow_env`), which uses Airflow's models
and `airflow.api.common.mark_tasks.set_dag_run_state_to_failed`, what the UI's and the REST
API's "mark failed" call: running task instances failed, unfinished ones skipped, the DAG run
failed, with the end dates and durations Airflow itself writes. A call costs an Airflow import
(a few seconds); the caller's process imports no Airflow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from stratoflow.services.state_files import last_lines


class AirflowRunsError(RuntimeError):
    """An Airflow API call on the metadata DB failed; the message quotes its output."""


@dataclass(frozen=True)
class Overview:
    """What the runner needs to know before and after a DAG run.

    Attributes:
        latest: (run id, state) of the DAG's newest run (created at or after `since`, when
            asked so), or None.
        running: (dag id, run id) of each running DAG run -> the PIDs its task instances
            recorded (`airflow dags test` records its own).
    """

    latest: tuple[str, str] | None
    running: dict[tuple[str, str], list[int]]


def overview(env: Mapping[str, str], dag_id: str, since: datetime | None = None) -> Overview:
    """The newest run of `dag_id` and every running DAG run with its task PIDs.

    Args:
        env: the Airflow environment of the home.
        dag_id: the DAG whose newest run is asked for.
        since: only a run Airflow created at or after this time (timezone-aware) counts as the
            newest: the run of a command started then.
    """
    answer = _call(env, "overview", dag_id=dag_id, since=_iso(since))
    latest = answer["latest"]
    return Overview(
        latest=(latest[0], latest[1]) if latest else None,
        running={(dag, run): pids for dag, run, pids in answer["running"]},
    )


def failed_tasks(env: Mapping[str, str], dag_id: str, run_id: str) -> list[tuple[str, int, str]]:
    """(task id, map index, state) of the run's failed and upstream-failed task instances, in
    the order they ran."""
    return [(str(t), int(i), str(s)) for t, i, s in _call(env, "failed_tasks", dag_id, run_id)]


def mark_failed(env: Mapping[str, str], dag_id: str, run_id: str) -> list[str]:
    """Mark a DAG run failed as the UI does; returns the task ids that were running."""
    return [str(task) for task in _call(env, "mark_failed", dag_id, run_id)]


def fail_newest(
    env: Mapping[str, str], dag_id: str, since: datetime
) -> tuple[str, list[str]] | None:
    """Mark the newest run of `dag_id` failed if Airflow created it at or after `since` (the
    run of a command started then, not an earlier one).

    One Airflow start instead of two: a stopped `stratoflow run` waits for it.

    Returns:
        (its run id, the task ids that were running), or None when there is no such run.
    """
    answer = _call(env, "fail_newest", dag_id, _iso(since))
    return None if answer is None else (str(answer[0]), [str(t) for t in answer[1]])


def _iso(moment: datetime | None) -> str:
    if moment is not None and moment.tzinfo is None:
        raise ValueError(f"{moment} has no timezone: Airflow's times are UTC")
    return "" if moment is None else moment.isoformat()


def _call(env: Mapping[str, str], operation: str, *args: str, **kwargs: str) -> Any:
    with tempfile.TemporaryDirectory(prefix="stratoflow-airflow-") as folder:
        answer = Path(folder) / "answer.json"
        request = json.dumps({"operation": operation, "args": args, "kwargs": kwargs})
        result = subprocess.run(
            [sys.executable, "-m", __name__, request, str(answer)],
            env=dict(env),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode or not answer.is_file():
            raise AirflowRunsError(
                f"{operation} on Airflow's metadata DB failed (exit code {result.returncode}):\n"
                f"{last_lines(result.stdout + result.stderr)}"
            )
        return json.loads(answer.read_text())


# ----- inside the Airflow environment -----------------------------------------------------------


def _overview(dag_id: str, since: str = "") -> dict[str, Any]:
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import select

    with create_session() as session:
        newest_query = select(DagRun).where(DagRun.dag_id == dag_id)
        if since:
            newest_query = newest_query.where(DagRun.created_at >= datetime.fromisoformat(since))
        newest = session.scalars(newest_query.order_by(DagRun.id.desc()).limit(1)).first()
        running: dict[tuple[str, str], list[int]] = {}
        for dag_run in DagRun.find(state=DagRunState.RUNNING, session=session):
            pids = running.setdefault((dag_run.dag_id, dag_run.run_id), [])
            for ti in dag_run.get_task_instances(session=session):
                if isinstance(ti, TaskInstance) and ti.pid is not None:
                    pids.append(int(ti.pid))
        return {
            "latest": [newest.run_id, str(newest.state)] if newest else None,
            "running": [[dag, run, pids] for (dag, run), pids in running.items() if pids],
        }


def _failed_tasks(dag_id: str, run_id: str) -> list[list[Any]]:
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    with create_session() as session:
        dag_run = DagRun.find_duplicate(dag_id, run_id, session=session)
        if dag_run is None:
            return []
        failed = dag_run.get_task_instances(
            state=[TaskInstanceState.FAILED, TaskInstanceState.UPSTREAM_FAILED], session=session
        )
        failed.sort(
            key=lambda ti: (
                ti.start_date is not None,  # never started (upstream failed) last, as SQLite did
                ti.start_date or 0,
                -(ti.priority_weight or 0),
                ti.task_id,
                ti.map_index,
            )
        )
        return [[ti.task_id, ti.map_index, str(ti.state)] for ti in failed]


def _mark_failed(dag_id: str, run_id: str) -> list[str]:
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models import DagRun
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session

    with create_session() as session:
        dag_run = DagRun.find_duplicate(dag_id, run_id, session=session)
        if dag_run is None:
            raise LookupError(f"no DAG run {run_id} of {dag_id}")
        dag = DBDagBag().get_dag_for_run(dag_run, session=session)
        if dag is None:
            raise LookupError(f"DAG {dag_id} of run {run_id} is not serialised in the DB")
        _updated, killed = set_dag_run_state_to_failed(
            dag=dag, run_id=run_id, commit=True, session=session
        )
        killed.sort(key=lambda ti: (ti.start_date is None, ti.start_date or 0, ti.task_id))
        return [ti.task_id for ti in killed]


def _fail_newest(dag_id: str, since: str) -> list[Any] | None:
    newest = _overview(dag_id, since)["latest"]
    if newest is None:
        return None
    return [newest[0], _mark_failed(dag_id, newest[0])]


_OPERATIONS: dict[str, Callable[..., Any]] = {
    "overview": _overview,
    "failed_tasks": _failed_tasks,
    "mark_failed": _mark_failed,
    "fail_newest": _fail_newest,
}


def main(argv: list[str]) -> None:
    """`python -m stratoflow.services.airflow_runs REQUEST ANSWER`: one operation, its JSON
    answer written to file ANSWER (Airflow logs to stdout)."""
    request = json.loads(argv[0])
    answer = _OPERATIONS[request["operation"]](*request["args"], **request["kwargs"])
    Path(argv[1]).write_text(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1:])
