"""Stopping `stratoflow run` while a multi_worker_mirrored run trains, as a user would.

Each test starts the real CLI in its own session (as a shell starts a foreground job), waits for
the first epoch line, signals it, then checks what is left: processes, epochs logged, the MLflow
run and the Airflow DAG run. Ctrl-C goes to the CLI's whole process group, as a terminal sends
it; SIGTERM and SIGKILL to the CLI alone, as `kill` does; and SIGKILL to its `airflow dags test`
alone, as the OOM killer might.

The module shares one Airflow home (migrated once) and one fresh MLflow store.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from stratoflow.cli import runner
from stratoflow.config import locations
from stratoflow.services import airflow_setup
from tests.conftest import fresh_mlflow_client

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

RUN = ["run", "mnist", "--strategy", "multi_worker_mirrored", "--workers", "2", "--epochs", "50"]
FIRST_EPOCH = re.compile(r"epoch 1/50")
START_TIMEOUT_S = 600  # Airflow start, dataset, TF imports in three processes on a busy host
STOP_TIMEOUT_S = 60  # the CLI kills its tree, then updates SQLite and MLflow (import included)
TREE_GONE_S = 10


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from fresh_mlflow_client(tmp_path_factory, "stop-mlflow")


@pytest.fixture(scope="module")
def airflow_db(mlflow_client: Any) -> Path:
    """The runner's Airflow home, migrated once for the module (not inside a timed run)."""
    home = airflow_setup.airflow_home()
    airflow_setup.ensure_airflow_db(home)
    return home / "airflow.db"


_started: list[psutil.Process] = []


@pytest.fixture(autouse=True)
def kill_leftovers() -> Iterator[None]:
    """A failed test must not leave its training running for the rest of the suite."""
    yield
    for process in _started:
        if _alive(process):
            process.kill()
    _started.clear()


@dataclass
class Training:
    """A `stratoflow run` subprocess that has started training."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    tree: list[psutil.Process] = field(default_factory=list)
    mlflow_run: Any = None

    def output(self) -> str:
        return "".join(self.lines)


def start_training(mlflow_client: Any) -> Training:
    env = {**os.environ, "PYTHONPATH": str(locations.PROJECT_ROOT)}
    earlier = {run.info.run_id for run in mlflow_runs(mlflow_client)}
    process = subprocess.Popen(
        [sys.executable, "-m", "stratoflow.cli.main", *RUN],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    training = Training(process)
    _started.append(psutil.Process(process.pid))
    started = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            training.lines.append(line)
            if FIRST_EPOCH.search(line):
                started.set()

    threading.Thread(target=read, daemon=True).start()
    if not started.wait(START_TIMEOUT_S):
        process.kill()
        pytest.fail(f"no first epoch within {START_TIMEOUT_S} s:\n{training.output()[-3000:]}")
    training.tree = psutil.Process(process.pid).children(recursive=True)
    _started.extend(training.tree)
    commands = [" ".join(child.cmdline()) for child in training.tree]
    assert sum("airflow dags test" in command for command in commands) == 1, commands
    assert sum("stratoflow.training.worker" in command for command in commands) == 2, commands
    (training.mlflow_run,) = [r for r in mlflow_runs(mlflow_client) if r.info.run_id not in earlier]
    assert training.mlflow_run.info.status == "RUNNING"
    return training


def mlflow_runs(mlflow_client: Any) -> list[Any]:
    experiment = mlflow_client.get_experiment_by_name("stratoflow/mnist")
    return [] if experiment is None else mlflow_client.search_runs([experiment.experiment_id])


def logged_epochs(mlflow_client: Any, run_id: str) -> int:
    return max((m.step for m in mlflow_client.get_metric_history(run_id, "loss")), default=0)


def seconds_until_gone(tree: list[psutil.Process], since: float, limit: float) -> float | None:
    """When every process of `tree` was gone (zombies count as gone), or None after `limit`."""
    while time.monotonic() - since < limit:
        if not [p for p in tree if _alive(p)]:
            return time.monotonic() - since
        time.sleep(0.1)
    return None


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def dag_run_states(db: Path, run_id: str) -> tuple[str, dict[str, str | None]]:
    with sqlite3.connect(db) as connection:
        (state,) = connection.execute(
            "SELECT state FROM dag_run WHERE run_id = ?", (run_id,)
        ).fetchone()
        tasks = dict(
            connection.execute(
                "SELECT task_id, state FROM task_instance WHERE run_id = ?", (run_id,)
            ).fetchall()
        )
    return state, tasks


def stop_cleanly(
    mlflow_client: Any, airflow_db: Path, signum: int, to_group: bool, exit_code: int
) -> None:
    training = start_training(mlflow_client)
    run_id = training.mlflow_run.info.run_id
    epochs_at_signal = logged_epochs(mlflow_client, run_id)
    sent = time.monotonic()
    if to_group:
        os.killpg(training.process.pid, signum)
    else:
        training.process.send_signal(signum)

    gone_after = seconds_until_gone(training.tree, sent, TREE_GONE_S)
    assert gone_after is not None, [p.pid for p in training.tree if _alive(p)]
    assert training.process.wait(STOP_TIMEOUT_S) == exit_code, training.output()[-3000:]
    exited_after = time.monotonic() - sent
    name = signal.Signals(signum).name
    stopped = [line for line in training.lines if f"Stopped by {name}" in line]
    assert len(stopped) == 1, training.output()[-3000:]
    dag_run_id = training.mlflow_run.data.tags["airflow.run_id"]
    assert "killed airflow dags test" in stopped[0]
    assert (
        f"DAG run {dag_run_id} of retrain_mnist marked failed (train_model was running)"
        in (stopped[0])
    )
    assert f"MLflow run {run_id} marked KILLED" in stopped[0]

    assert mlflow_client.get_run(run_id).info.status == "KILLED"
    state, tasks = dag_run_states(airflow_db, dag_run_id)
    assert state == "failed"
    assert tasks == {
        "prepare_dataset": "success",
        "validate_data": "success",
        "train_model": "failed",
        "evaluate_model": "skipped",
        "log_and_register": "skipped",
    }
    epochs_at_exit = logged_epochs(mlflow_client, run_id)
    log.info(
        "%s: tree gone %.1f s and the CLI exited %.1f s after the signal; epochs logged: %d "
        "at the signal, %d at the exit",
        name,
        gone_after,
        exited_after,
        epochs_at_signal,
        epochs_at_exit,
    )
    assert epochs_at_exit <= epochs_at_signal + 1  # at most the epoch that was being logged
    time.sleep(5)
    assert logged_epochs(mlflow_client, run_id) == epochs_at_exit
    assert not locations.run_dir("retrain_mnist", dag_run_id).exists()


def test_ctrl_c_stops_the_whole_run_and_marks_it_killed(mlflow_client: Any, airflow_db: Path):
    stop_cleanly(mlflow_client, airflow_db, signal.SIGINT, to_group=True, exit_code=130)


def test_sigterm_stops_the_whole_run_and_marks_it_killed(mlflow_client: Any, airflow_db: Path):
    stop_cleanly(mlflow_client, airflow_db, signal.SIGTERM, to_group=False, exit_code=143)


def test_sigkill_takes_the_tree_down_and_the_next_run_ends_what_it_left(
    mlflow_client: Any, airflow_db: Path, caplog: pytest.LogCaptureFixture
):
    training = start_training(mlflow_client)
    run_id = training.mlflow_run.info.run_id
    epochs_at_signal = logged_epochs(mlflow_client, run_id)
    sent = time.monotonic()
    training.process.kill()

    gone_after = seconds_until_gone(training.tree, sent, TREE_GONE_S)
    assert gone_after is not None, [p.pid for p in training.tree if _alive(p)]
    assert training.process.wait(STOP_TIMEOUT_S) == -signal.SIGKILL
    epochs_at_exit = logged_epochs(mlflow_client, run_id)
    log.info(
        "SIGKILL: tree gone %.1f s after the signal; epochs logged: %d at the signal, %d after",
        gone_after,
        epochs_at_signal,
        epochs_at_exit,
    )
    assert epochs_at_exit <= epochs_at_signal + 1
    time.sleep(5)
    assert logged_epochs(mlflow_client, run_id) == epochs_at_exit
    # Nothing could say so yet: what the next `stratoflow run` finds before it starts.
    dag_run_id = training.mlflow_run.data.tags["airflow.run_id"]
    assert dag_run_states(airflow_db, dag_run_id)[0] == "running"
    assert mlflow_client.get_run(run_id).info.status == "RUNNING"

    # The next run ends it before it starts: the killed runner's record of its `airflow dags
    # test` is left, its process gone.
    next_run_ends(mlflow_client, airflow_db, caplog, dag_run_id, run_id)


def test_a_dead_airflow_dags_test_leaves_its_dag_run_to_the_next_run(
    mlflow_client: Any, airflow_db: Path, caplog: pytest.LogCaptureFixture
):
    """`airflow dags test` dies under a living CLI (the OOM killer, a crash in a task): the CLI
    fails saying which DAG run was left running, and keeps its record of the process, so the
    next run ends that DAG run before it starts, as after a SIGKILLed CLI."""
    training = start_training(mlflow_client)
    run_id = training.mlflow_run.info.run_id
    dag_run_id = training.mlflow_run.data.tags["airflow.run_id"]
    (dags_test,) = [p for p in training.tree if "airflow dags test" in " ".join(p.cmdline())]
    sent = time.monotonic()
    dags_test.kill()

    assert seconds_until_gone(training.tree, sent, TREE_GONE_S) is not None
    assert training.process.wait(STOP_TIMEOUT_S) == 1, training.output()[-3000:]
    said = f"DAG run {dag_run_id} of retrain_mnist running (airflow dags test exit code -9)"
    deadline = time.monotonic() + 10  # the reader thread may still be copying the last lines
    while said not in training.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said in training.output(), training.output()[-3000:]
    assert dag_run_states(airflow_db, dag_run_id)[0] == "running"
    assert mlflow_client.get_run(run_id).info.status == "RUNNING"

    next_run_ends(mlflow_client, airflow_db, caplog, dag_run_id, run_id)


def next_run_ends(
    mlflow_client: Any,
    airflow_db: Path,
    caplog: pytest.LogCaptureFixture,
    dag_run_id: str,
    run_id: str,
) -> None:
    """The next run marks DAG run `dag_run_id` failed and MLflow run `run_id` KILLED before it
    starts, and leaves nothing for a later run to look for. Its conf is one Airflow refuses
    before it creates a DAG run: what a run does before Airflow runs anything is what counts,
    and the DAG's earlier runs must not be taken for its own."""
    home = airflow_db.parent
    with (
        caplog.at_level(logging.WARNING, logger=runner.__name__),
        pytest.raises(runner.RunError, match="No DAG run of retrain_mnist was created"),
    ):
        runner.dags_test("retrain_mnist", {"epochs": "many"}, home, airflow_setup.airflow_env(home))
    assert (
        f"DAG run {dag_run_id} of retrain_mnist was left running by a killed stratoflow run: "
        f"marked failed (train_model was running), MLflow run {run_id} marked KILLED"
    ) in caplog.text

    assert mlflow_client.get_run(run_id).info.status == "KILLED"
    state, tasks = dag_run_states(airflow_db, dag_run_id)
    assert state == "failed"
    assert tasks["train_model"] == "failed"
    assert runner.reconcile_orphaned_runs(home) == []
    assert list((home / runner.DAGS_TEST_RECORDS).iterdir()) == []  # nothing left to look for
