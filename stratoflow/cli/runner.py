"""The local runner behind `make run`: one real DAG run with `airflow dags test`, then a summary.

`airflow dags test` runs the DAG's tasks one after the other in a single process (TensorFlow is
imported once), with the same Params validation, retries and callbacks as under a scheduler. The
runner gives Airflow its own home inside the state folder (SQLite metadata DB, this repo's `dags/`,
no example DAGs), so a run touches nothing outside the project's `.stratoflow/`, and what it
writes there is its owner's only (`stratoflow.services.file_modes`).

The tests start their Airflow subprocesses with `airflow_env` too, so both use the same setup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stratoflow.cli.tables import format_table
from stratoflow.cli.task_failures import TaskFailure, TaskFailureReader, task_label
from stratoflow.config import locations, names
from stratoflow.config.params import benchmark_params
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import resolve_plan
from stratoflow.config.spec import list_pipelines, load_spec
from stratoflow.config.training import validate_params
from stratoflow.distributed.processes import ManagedProcess, die_with_parent, stop_tree
from stratoflow.services import airflow_runs
from stratoflow.services.airflow_runs import AirflowRunsError
from stratoflow.services.airflow_setup import (
    AirflowSetupError,
    airflow_command,
    airflow_env,
    airflow_home,
    ensure_airflow_db,
)
from stratoflow.services.file_modes import OWNER_ONLY_UMASK, private_folder, private_state_folder
from stratoflow.services.state_files import write_private
from stratoflow.tracking import run_summary

log = logging.getLogger(__name__)

# The signals that stop a local run cleanly (Ctrl-C, and what `kill`, systemd or CI send).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# In the Airflow home: a record (PID and start) of each `airflow dags test` the runner started,
# so that a later run knows whether it still runs, whatever the wall clock did meanwhile.
DAGS_TEST_RECORDS = "dags-test-processes"
# How long the output copier may go on after `airflow dags test` exited (its pipe may still be
# held open by a process it left behind).
OUTPUT_DRAIN_SECONDS = 10.0


class RunError(RuntimeError):
    """The local run could not start or its DAG run failed; the message says why."""

    def __init__(self, message: str, run_id: str | None = None):
        super().__init__(message)
        self.run_id = run_id  # the failed DAG run, if one was created


class RunStopped(Exception):
    """SIGINT or SIGTERM stopped a DAG run in progress; the message says what was stopped."""

    def __init__(self, message: str, signum: int, run_id: str | None = None):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
        self.run_id = run_id


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived. A KeyboardInterrupt, so `except Exception` lets it through."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise `Stopped` (SIGTERM would otherwise kill the CLI
    at once and leave its `airflow dags test` running). Only the main thread gets signals."""

    def raise_stopped(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    with _handling(STOP_SIGNALS, raise_stopped):
        yield


def _stoppable(
    command: Callable[[str, dict[str, Any]], int],
) -> Callable[[str, dict[str, Any]], int]:
    @functools.wraps(command)
    def run(pipeline: str, conf: dict[str, Any]) -> int:
        with stop_on_signals():
            try:
                return command(pipeline, conf)
            except RunStopped as stopped:
                log.error("%s", stopped)
                return stopped.exit_code
            except Stopped as stopped:
                log.error("Stopped by %s; no DAG run was in progress.", stopped)
                return 128 + stopped.signum

    return run


def check_conf(pipeline: str, conf: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse a bad run config before Airflow starts, with the messages Airflow would give.

    Airflow validates each Param against its JSON schema when it creates the DAG run; this does
    the same, and also refuses unknown keys and bad combinations (which Airflow would only
    report when the first task starts), by resolving the run's plan.

    Returns:
        The conf the plan resolved (every training setting, clusters named): what the DAG run
        is given, so the run Airflow records is the one checked here.

    Raises:
        SpecError: unknown pipeline, unknown key, invalid value or invalid combination.
    """
    return resolve_plan(pipeline, conf).conf()


def check_benchmark_conf(pipeline: str, conf: Mapping[str, Any]) -> dict[str, Any]:
    """`check_conf` for the strategy-benchmark DAG's Params (epochs, seed, strategies, tolerance).

    Returns:
        `conf` as given (the benchmark resolves each strategy's settings in its own tasks).

    Raises:
        SpecError: unknown pipeline, unknown key or invalid value.
    """
    from stratoflow.tasks.strategy_benchmark import benchmark_spec

    spec = load_spec(pipeline)
    if spec.task != "classification":
        raise SpecError(
            f"pipeline {pipeline!r} is a {spec.task} pipeline: the strategy benchmark compares "
            "test accuracies, so only classification pipelines have one"
        )
    validate_params(benchmark_params(spec), conf)
    benchmark_spec(pipeline, dict(conf))
    return dict(conf)


@_stoppable
def run_pipeline(pipeline: str, conf: dict[str, Any]) -> int:
    """Run pipeline `pipeline` once, for real, through Airflow, then print a summary.

    Args:
        pipeline: a name from `stratoflow.config.spec.list_pipelines()`.
        conf: the run's Params overrides, e.g. `{"strategy": "mirrored", "epochs": 2}`.

    Returns:
        0 when the DAG run succeeded and was summarised, 1 otherwise (the reason is logged),
        130 or 143 when SIGINT or SIGTERM stopped it (see `dags_test`).
    """
    try:
        run_id = _run_locally(pipeline, names.retrain_dag_id(pipeline), conf, check_conf)
    except (SpecError, RunError) as error:
        log.error("%s", error)
        return 1
    return _print_summary(pipeline, run_id)


@_stoppable
def run_benchmark(pipeline: str, conf: dict[str, Any]) -> int:
    """Run pipeline `pipeline`'s strategy benchmark once through Airflow, then print the table.

    Args:
        pipeline: a name from `stratoflow.config.spec.list_pipelines()`.
        conf: the benchmark's Params, e.g. `{"epochs": 2, "strategies": ["one_device"]}`.

    Returns:
        0 when the benchmark recommended a strategy (some strategies may have failed: the table
        says which and why), 1 otherwise (the reason is logged, and the table printed if any),
        130 or 143 when SIGINT or SIGTERM stopped it.
    """
    dag_id = names.benchmark_dag_id(pipeline)
    try:
        run_id = _run_locally(pipeline, dag_id, conf, check_benchmark_conf)
    except RunError as error:
        log.error("%s", error)
        if error.run_id:  # the comparison lists each strategy's error
            _print_benchmark(pipeline, dag_id, (error.run_id, "failed"))
        return 1
    except SpecError as error:
        log.error("%s", error)
        return 1
    return _print_benchmark(pipeline, dag_id, (run_id, "success"))


def _run_locally(
    pipeline: str,
    dag_id: str,
    conf: dict[str, Any],
    check: Callable[[str, Mapping[str, Any]], dict[str, Any]],
) -> str:
    if pipeline not in list_pipelines():
        raise SpecError(f"unknown pipeline {pipeline!r}; available: {', '.join(list_pipelines())}")
    conf = check(pipeline, conf)
    # Run data (models, checkpoints, artifacts, the tracking and metadata DBs): owner only.
    private_state_folder(locations.state_dir())
    home = airflow_home()
    env = airflow_env(home)
    try:
        ensure_airflow_db(home, env)
    except AirflowSetupError as error:
        raise RunError(str(error)) from None
    return dags_test(dag_id, conf, home, env)


def dags_test(dag_id: str, conf: Mapping[str, Any], home: Path, env: Mapping[str, str]) -> str:
    """Run DAG `dag_id` once with `airflow dags test` and return its run id.

    `airflow dags test` runs in its own process group, so a Ctrl-C in the terminal reaches only
    this process, which then stops the run as a whole: on SIGINT or SIGTERM (raised here as
    `KeyboardInterrupt`) it kills the process tree of `airflow dags test` (training processes
    included), marks the DAG run failed in the metadata DB, ends its MLflow runs KILLED and
    raises `RunStopped`. If this process is SIGKILLed, `airflow dags test` gets SIGKILL too
    (`PR_SET_PDEATHSIG`; its training processes die with it the same way), and the next call
    finishes off what it left running (`reconcile_orphaned_runs`). The DAG runs are read and
    marked through Airflow's own API (`stratoflow.services.airflow_runs`), which costs a process
    importing Airflow: a run asks it nothing before it starts unless a record of an earlier
    `airflow dags test` is left whose process is gone (a killed runner's, or a crash's), and
    nothing after a run that succeeded.

    Raises:
        RunError: the DAG run failed or was not created (names the failed tasks and, last, the
            exception each one raised, read from the output of `airflow dags test`).
        RunStopped: SIGINT or SIGTERM stopped it; the message says what was stopped.
    """
    if _left_behind(home):
        try:
            reconcile_orphaned_runs(home, env)
        except AirflowRunsError as error:
            raise RunError(str(error)) from None
    command = airflow_command("dags", "test", dag_id, "-c", json.dumps(conf))
    log.info("Running %s with conf %s (Airflow home %s)", dag_id, json.dumps(conf), home)
    # The DAG run Airflow creates for this command is the newest one created from now on: what
    # a stop or a failure marks or reports, and never an earlier run.
    started = datetime.now(UTC)
    # Its stdout (Airflow's log, where a task's exception is) is copied to ours as it comes,
    # so the task logs stream as they are written, and read for why a task failed; stderr goes
    # straight to ours. Unbuffered, so that print() output keeps its place among the log lines.
    # Plain tracebacks (Airflow uses rich ones when $DEV is set), which the reader parses. Its
    # own process group is a background one: it must not wait for terminal input (SIGTTIN).
    process = subprocess.Popen(
        command,
        env={**env, "PYTHONUNBUFFERED": "1", "DEV": ""},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        process_group=0,
        umask=OWNER_ONLY_UMASK,  # what the run writes is its owner's only
        preexec_fn=die_with_parent(signal.SIGKILL),
    )
    record = ManagedProcess.started(process)
    # Removed once nothing of the run can be left running; left behind (by a SIGKILL, a crash
    # of `airflow dags test`), it tells the next run to look for orphaned DAG runs.
    record_path = remember_dags_test(home, record)
    reader = TaskFailureReader()
    outcome = DagRunOutcome()
    copier = threading.Thread(
        target=_copy_output,
        args=(process, reader, outcome),
        name="dags-test-output",
        daemon=True,
    )
    copier.start()
    try:
        returncode = process.wait()
    except KeyboardInterrupt as interrupt:
        signum = getattr(interrupt, "signum", signal.SIGINT)
        with _handling(STOP_SIGNALS, signal.SIG_IGN):  # a 2nd Ctrl-C must not cut the clean-up
            raise _stop(record, record_path, dag_id, env, started, signum) from None
    finally:
        # A process it left behind may hold the pipe open: do not wait for it for long.
        copier.join(OUTPUT_DRAIN_SECONDS)
    # `dags test` makes up its run id (manual__<time>) and says it at the end of a run that
    # finished; otherwise (a crash, a kill) the metadata DB knows which run it was.
    if outcome.finished:  # Airflow ended the DAG run itself: nothing of it is left running
        record_path.unlink(missing_ok=True)
    if returncode == 0 and outcome.finished and outcome.finished[1] == "success":
        return outcome.finished[0]
    run = outcome.finished
    if run is None:
        try:
            run = airflow_runs.overview(env, dag_id, since=started).latest
        except AirflowRunsError as error:
            raise RunError(f"airflow dags test exited {returncode}, then {error}") from None
        if run is None or run[1] != "running":  # else the next run ends it (its record stays)
            record_path.unlink(missing_ok=True)
    if returncode or run is None or run[1] != "success":
        raise RunError(
            _failure_message(dag_id, returncode, env, run, reader.failures),
            run_id=run[0] if run else None,
        )
    return run[0]


# Airflow's own last line of a DAG run that `dags test` ran to its end (airflow.models.dagrun).
_FINISHED = re.compile(r"DagRun Finished: dag_id=[^,]+, .*?\brun_id=([^,\s]+), .*?\bstate=(\w+)")


class DagRunOutcome:
    """The run id and state `airflow dags test` reports for the DAG run it finished, read from
    its output, so that a successful run needs no second Airflow start to learn its run id."""

    def __init__(self) -> None:
        self.finished: tuple[str, str] | None = None

    def take_line(self, line: str) -> None:
        if "DagRun Finished" in line and (match := _FINISHED.search(line)):
            self.finished = (match[1], match[2])


def _copy_output(
    process: subprocess.Popen[bytes], reader: TaskFailureReader, outcome: DagRunOutcome
) -> None:
    """Copy the process's stdout to ours (file descriptor 1) and feed its lines to `reader`
    and `outcome`."""
    assert process.stdout is not None
    copying = True
    for line in iter(process.stdout.readline, b""):
        if copying:
            try:
                _write_all(1, line)
            except OSError:  # our stdout was closed (`| head`): keep reading, stop copying
                copying = False
        text = line.decode("utf-8", errors="replace")
        reader.take_line(text)
        outcome.take_line(text)
    reader.finish()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _failure_message(
    dag_id: str,
    returncode: int,
    env: Mapping[str, str],
    run: tuple[str, str] | None,
    failures: Mapping[str, TaskFailure],
) -> str:
    """What failed and why, the cause last: the DAG run, its failed tasks, each one's error."""
    if run is None:
        return (
            f"No DAG run of {dag_id} was created (airflow dags test exit code {returncode}); "
            "its output is above."
        )
    states = _failed_tasks(env, dag_id, run[0])
    failed = [task for task, state in states if state == "failed"]
    upstream = [task for task, state in states if state == "upstream_failed"]
    # A task that failed in the output but not in the DB (it could not be read) still counts.
    failed += [task for task in failures if task not in failed]
    lines = [
        f"DAG run {run[0]} of {dag_id} {run[1]} (airflow dags test exit code {returncode})"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; not run, upstream failed: {', '.join(upstream)}" if upstream else "")
        + ". The task logs are above; why it failed:"
    ]
    for task in failed:
        failure = failures.get(task)
        lines.append(
            failure.describe()
            if failure
            else f"{task} failed; its exception is not in the output above (the task's process "
            "may have been killed)"
        )
    if not failed:
        lines.append("no task failed; the output above says why the DAG run did")
    return "\n".join(lines)


def _stop(
    record: ManagedProcess,
    record_path: Path,
    dag_id: str,
    env: Mapping[str, str],
    started: datetime,
    signum: int,
) -> RunStopped:
    name = signal.Signals(signum).name
    killed = stop_tree(record, "airflow dags test")
    what = f"Stopped by {name}: killed airflow dags test (pid {record.pid})" + (
        f" and the {killed} process(es) it had started" if killed else ""
    )
    try:
        failed = airflow_runs.fail_newest(env, dag_id, since=started)
    except AirflowRunsError as error:  # its record stays: the next run ends the DAG run
        return RunStopped(f"{what}; its DAG run could not be marked failed ({error}).", signum)
    record_path.unlink(missing_ok=True)
    if failed is None:
        return RunStopped(f"{what} before it created a DAG run.", signum)
    run_id, interrupted = failed
    ended = _kill_mlflow_runs(dag_id, run_id, _marked(interrupted))
    return RunStopped(f"{what}; DAG run {run_id} of {dag_id} {ended}.", signum, run_id)


def reconcile_orphaned_runs(home: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """Fail the DAG runs of Airflow home `home` that a killed `airflow dags test` left running.

    The local runner has no scheduler to notice: a DAG run is orphaned when it is "running" and
    none of its task instances' processes (`task_instance.pid`, set by `airflow dags test`) is
    one the runner started and still running (`DAGS_TEST_RECORDS`). Each is marked failed, its
    MLflow runs KILLED (one log line per run). `dags_test` calls it when a record of a process
    that has ended is left behind.

    Args:
        home: the Airflow home.
        env: its Airflow environment; `airflow_env(home)` by default.

    Returns:
        The run ids it marked failed.

    Raises:
        AirflowRunsError: the running DAG runs could not be read.
    """
    env = airflow_env(home) if env is None else env
    running = airflow_runs.overview(env, "").running if (home / "airflow.db").is_file() else {}
    return _end_orphaned_runs(home, env, running)


def _left_behind(home: Path) -> bool:
    """Whether a record of an `airflow dags test` is left whose process has ended: a runner was
    killed (or its `airflow dags test` crashed) and may have left a DAG run running."""
    return any(
        not is_running_dags_test(home, int(path.stem))
        for path in (home / DAGS_TEST_RECORDS).glob("*.json")
    )


def _end_orphaned_runs(
    home: Path, env: Mapping[str, str], running: Mapping[tuple[str, str], list[int]]
) -> list[str]:
    orphaned = [
        run for run, pids in running.items() if not any(is_running_dags_test(home, p) for p in pids)
    ]
    for dag_id, run_id in orphaned:
        log.warning(
            "DAG run %s of %s was left running by a killed stratoflow run: %s",
            run_id,
            dag_id,
            _end_dag_run(env, dag_id, run_id),
        )
    _forget_dead(home)
    return [run_id for _, run_id in orphaned]


def remember_dags_test(home: Path, record: ManagedProcess) -> Path:
    """Record an `airflow dags test` this runner started (removed when it has ended)."""
    path = private_folder(home / DAGS_TEST_RECORDS) / f"{record.pid}.json"
    write_private(path, record.to_dict())
    return path


def is_running_dags_test(home: Path, pid: int) -> bool:
    """Whether `pid` is an `airflow dags test` this runner started and is still running (not a
    later process reusing its PID). A PID the runner has no record of is not its own."""
    path = home / DAGS_TEST_RECORDS / f"{pid}.json"
    try:
        return ManagedProcess.from_dict(json.loads(path.read_text())).is_alive()
    except (OSError, ValueError, KeyError):
        return False


def _forget_dead(home: Path) -> None:
    """Remove the records of `airflow dags test` processes that have ended (a killed runner's)."""
    for path in (home / DAGS_TEST_RECORDS).glob("*.json"):
        if not is_running_dags_test(home, int(path.stem)):
            path.unlink(missing_ok=True)


def _end_dag_run(env: Mapping[str, str], dag_id: str, run_id: str) -> str:
    """Mark a DAG run whose processes are dead failed, end its MLflow runs KILLED; say what."""
    try:
        said = _marked(airflow_runs.mark_failed(env, dag_id, run_id))
    except AirflowRunsError as error:
        said = f"could not be marked failed ({error})"
    return _kill_mlflow_runs(dag_id, run_id, said)


def _marked(interrupted: list[str]) -> str:
    return "marked failed" + (f" ({', '.join(interrupted)} was running)" if interrupted else "")


def _kill_mlflow_runs(dag_id: str, run_id: str, said: str) -> str:
    """End the DAG run's MLflow runs KILLED; `said` (what happened in Airflow) and what did."""
    try:
        from stratoflow.tasks.clean_up import clean_up_stopped_run
        from stratoflow.tasks.run_context import AirflowRun

        ended = clean_up_stopped_run(_pipeline_of(dag_id), AirflowRun(dag_id, run_id))
    except Exception as error:  # the DB is right already; say what MLflow still shows
        return (
            f"{said}; its MLflow run could not be marked KILLED ({type(error).__name__}: {error})"
        )
    if not ended:
        return f"{said}; it had no MLflow run in progress"
    return f"{said}, MLflow run{'s' if len(ended) > 1 else ''} {', '.join(ended)} marked KILLED"


@contextlib.contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM are ignored: a 2nd Ctrl-C must not cut a clean-up."""
    with _handling(STOP_SIGNALS, signal.SIG_IGN):
        yield


@contextlib.contextmanager
def _handling(signals: Sequence[int], handler: Any) -> Iterator[None]:
    """While inside, `handler` handles `signals`; then the previous handlers again. Only the main
    thread can set handlers (and gets signals): elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _pipeline_of(dag_id: str) -> str:
    for prefix in (names.BENCHMARK_DAG_PREFIX, names.RETRAIN_DAG_PREFIX):
        if dag_id.startswith(prefix):
            return dag_id.removeprefix(prefix)
    return dag_id


def _failed_tasks(env: Mapping[str, str], dag_id: str, run_id: str) -> list[tuple[str, str]]:
    """(task instance, state) of the run's failed and upstream-failed task instances, as they
    ran; a task instance is named as `task_failures.task_label` names it."""
    try:
        rows = airflow_runs.failed_tasks(env, dag_id, run_id)
    except AirflowRunsError as error:
        log.warning("Could not read the task states of DAG run %s: %s", run_id, error)
        return []
    return [(task_label(task, index), state) for task, index, state in rows]


def _print_summary(pipeline: str, run_id: str) -> int:
    dag_id = names.retrain_dag_id(pipeline)
    try:
        # Kept by the run's last task; only without it does this process import MLflow.
        summary = run_summary.recorded(dag_id, run_id)
        if summary is None:
            from stratoflow.tracking.reports import describe_dag_run

            summary = describe_dag_run(pipeline, dag_id, run_id)
    except Exception:
        log.exception("The DAG run %s succeeded, but summarising it failed", run_id)
        return 1
    sys.stdout.write(format_summary(pipeline, run_id, summary))
    return 0


def _print_benchmark(pipeline: str, dag_id: str, run: tuple[str, str] | None) -> int:
    if run is None:
        return 1
    try:
        from stratoflow.tasks.strategy_benchmark import read_comparison

        comparison = read_comparison(pipeline, dag_id, run[0])
    except Exception:
        log.exception("Could not read the comparison of benchmark run %s", run[0])
        return 1
    if comparison is None:
        log.error("The benchmark run %s wrote no comparison", run[0])
        return 1
    sys.stdout.write(format_benchmark(comparison))
    return 0 if run[1] == "success" and comparison.get("recommendation") else 1


def format_benchmark(comparison: Mapping[str, Any]) -> str:
    """The text `stratoflow benchmark` prints: the table, failures, recommendation and rule.

    Args:
        comparison: the `benchmark/comparison.json` a benchmark run logged on its parent run.
    """
    from stratoflow.training.strategy_benchmark import TABLE_COLUMNS, cells, first_line

    rows = comparison["strategies"]
    table = [dict(zip(TABLE_COLUMNS, cells(row), strict=True)) for row in rows]
    recommendation = comparison.get("recommendation")
    lines = [
        "",
        f"Strategy benchmark of {comparison['pipeline']} ({comparison['epochs']} epochs, seed "
        f"{comparison['seed']}, threshold val_accuracy >= {comparison['threshold']}), "
        f"MLflow run {comparison['parent_run_id']}:",
        "",
        format_table(table, TABLE_COLUMNS).rstrip("\n"),
        *(
            f"  failed: {row['strategy']}: {first_line(row.get('error'))}"
            for row in rows
            if row["status"] != "succeeded"
        ),
        *(f"  not run: {name}: {why}" for name, why in (comparison.get("not_run") or {}).items()),
        "",
        f"Recommended for this host: {recommendation['strategy']}"
        if recommendation
        else "No recommendation: no strategy succeeded.",
        *([f"  why: {recommendation['reason']}."] if recommendation else []),
        f"  rule: {comparison['rule']}",
        "",
    ]
    return "\n".join(lines)


def format_summary(pipeline: str, run_id: str, summary: Mapping[str, Any]) -> str:
    """The text `make run` prints after a successful run.

    Args:
        pipeline: the pipeline name.
        run_id: the Airflow run id.
        summary: `stratoflow.tracking.reports.describe_dag_run`'s result (as the run's last
            task kept it: `stratoflow.tracking.run_summary`).
    """
    metrics = summary.get("test_metrics") or {}
    aliases: Sequence[str] = summary.get("aliases") or []
    lines = [
        "",
        f"Pipeline {pipeline}: DAG run {run_id} succeeded",
        "  test metrics: "
        + (", ".join(f"{name}={_number(value)}" for name, value in sorted(metrics.items())) or "-"),
        f"  MLflow run: {summary.get('mlflow_run_id') or '-'}",
        f"  registered model: {summary.get('registered_model') or '-'} "
        f"version {summary.get('version') or '-'} "
        f"(aliases: {', '.join(aliases) if aliases else 'none'})",
        *([f"  evaluation gate: {summary['gate']}"] if summary.get("gate") else []),
        f"  browse it: {summary.get('ui_command') or '-'}",
        "",
    ]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
