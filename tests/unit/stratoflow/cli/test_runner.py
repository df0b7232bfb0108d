"""The local runner's own records of the `airflow dags test` processes it started, the conf it
starts a run with, and the summary it prints."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stratoflow.cli import runner
from stratoflow.config import locations
from stratoflow.distributed.processes import ManagedProcess


def test_a_running_dags_test_is_still_known_after_a_wall_clock_step(tmp_path: Path) -> None:
    """A second `stratoflow run` must not fail the DAG run of one still in progress.

    It asks whether each running DAG run's task process is alive. A clock step (NTP, a resumed
    laptop or VM) after that process started moves psutil's `create_time` of every process; the
    runner's record (start after boot) does not move, so the process is still known as its own,
    and a later process reusing the PID is not.
    """
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = runner.remember_dags_test(tmp_path, ManagedProcess.started(process))
        # Only its owner may read or forge a record (a forged one would keep a dead run "live").
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        record = json.loads(path.read_text())
        # As written before the clock went 30 s on: the live create_time is now 30 s later.
        path.write_text(json.dumps({**record, "create_time": record["create_time"] - 30.0}))
        assert runner.is_running_dags_test(tmp_path, process.pid)
        reused = {**record, "seconds_after_boot": record["seconds_after_boot"] - 5.0}
        path.write_text(json.dumps(reused))
        assert not runner.is_running_dags_test(tmp_path, process.pid)
        path.write_text(json.dumps(record))
        assert runner.is_running_dags_test(tmp_path, process.pid)
        assert not runner.is_running_dags_test(tmp_path, 1)  # a process it has no record of
    finally:
        process.kill()
        process.wait()
    assert not runner.is_running_dags_test(tmp_path, process.pid)


# What Airflow 3.3's `airflow dags test` logs at the end of the DAG run it ran (a real line).
FINISHED_LINE = (
    "2026-12-06T06:29:55.185869Z [info     ] DagRun Finished: dag_id=retrain_digits, "
    "logical_date=2026-12-06 06:29:32.445688+00:00, run_id=manual__2026-12-06T06:29:33.200105"
    "+00:00, run_start_date=2026-12-06 06:29:32.445688+00:00, run_end_date=2026-12-06 "
    "06:29:55.185771+00:00, run_duration=22.740083, state=success, run_type=manual, "
    "data_interval_start=2026-12-06 06:29:32.445688+00:00, data_interval_end=2026-12-06 "
    "06:29:32.445688+00:00, [airflow.models.dagrun.DagRun] loc=dagrun.py:1315\n"
)


def test_the_finished_runs_id_and_state_are_read_from_the_output_of_dags_test() -> None:
    outcome = runner.DagRunOutcome()
    outcome.take_line("[info] Marking run <DagRun retrain_digits ...> successful\n")
    assert outcome.finished is None
    outcome.take_line(FINISHED_LINE)
    assert outcome.finished == ("manual__2026-12-06T06:29:33.200105+00:00", "success")
    outcome.take_line(FINISHED_LINE.replace("state=success", "state=failed"))
    assert outcome.finished == ("manual__2026-12-06T06:29:33.200105+00:00", "failed")


def test_the_dag_run_gets_the_conf_the_runner_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    """`stratoflow run` resolves the run's plan for its checks and hands Airflow what it resolved
    (every setting, the deployment's cluster named), not the raw flags. Airflow itself is left
    out here (a real `airflow dags test` of the runner: tests/integration/test_retrain_dag.py):
    the stand-in records the conf `airflow dags test -c` would get."""
    from stratoflow.config import clusters
    from stratoflow.config.run_plan import resolve_plan

    given: list[dict[str, Any]] = []

    def recording_dags_test(dag_id: str, conf: dict[str, Any], *_: Any) -> str:
        given.append(dict(conf))
        return "manual__x"

    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"default": "10.0.0.1:6379"}))
    monkeypatch.setattr(runner, "ensure_airflow_db", lambda *_: None)
    monkeypatch.setattr(runner, "dags_test", recording_dags_test)
    monkeypatch.setattr(runner, "_print_summary", lambda *_: 0)

    assert runner.run_pipeline("mnist", {"launcher": "ray", "epochs": 2}) == 0
    (conf,) = given
    assert conf == resolve_plan("mnist", {"launcher": "ray", "epochs": 2}).conf()
    assert (conf["ray_cluster"], conf["epochs"], conf["strategy"]) == ("default", 2, "one_device")


# A summary as `stratoflow.tracking.reports.describe_dag_run` gives it (a real run's).
SUMMARY = {
    "mlflow_run_id": "dcb81f63bc6740acad50064e1d3ff39e",
    "status": "FINISHED",
    "test_metrics": {"test_accuracy": 0.8938547486033519, "test_loss": 0.41206178069114685},
    "registered_model": "stratoflow-digits",
    "version": "1",
    "aliases": ["challenger"],
    "gate": "test_accuracy 0.8939 is below the minimum 0.9000",
    "ui_command": "mlflow ui --backend-store-uri sqlite:////tmp/s/mlflow.db --port 5000",
}
PRINT_SUMMARY = """
import json, sys
from stratoflow.cli import runner
from stratoflow.tracking import run_summary

path = run_summary.summary_path("retrain_digits", sys.argv[1])
path.parent.mkdir(parents=True)
path.write_text(sys.argv[2])
code = runner._print_summary("digits", sys.argv[1])
print("mlflow imported:", "mlflow" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def test_the_summary_is_printed_from_what_the_run_kept_without_importing_mlflow(
    tmp_path: Path,
) -> None:
    """The run's last task keeps the summary in the run folder; the CLI prints it as it printed
    what it asked MLflow (`format_summary`), without MLflow's import (about 2 s of CPU). The
    store here holds no run: asked, MLflow would find none."""
    run_id = FINISHED_LINE.split("run_id=")[1].split(",")[0]
    done = subprocess.run(
        [sys.executable, "-c", PRINT_SUMMARY, run_id, json.dumps(SUMMARY)],
        env={
            **os.environ,
            locations.STATE_DIR_ENV: str(tmp_path),
            locations.TRACKING_URI_ENV: f"sqlite:///{tmp_path / 'mlflow.db'}",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == runner.format_summary("digits", run_id, SUMMARY)
    assert "mlflow imported: False" in done.stderr
