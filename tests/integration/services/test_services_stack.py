"""The deployment topology for real: PostgreSQL, an MLflow server, Airflow's api-server, scheduler,
dag-processor and triggerer as separate processes (`stratoflow.services`), used over HTTP as a
user would, with a token.

One stack serves the whole package (conftest.py; the UI trigger tests use it first). Two DAG
runs go on at the same time (the stack has a parallelism of 2), with faults injected while they
run:

- a REST-triggered mnist run (mirrored, 2 replicas, 2 epochs) whose scheduler is SIGKILLed and
  restarted while `train_model` runs;
- the `refresh_stratoflow_digits` DAG, whose asset event makes the scheduler start a digits run,
  whose training process is SIGKILLed after a checkpoint: Airflow's retry resumes from it.

Then a digits run's task process is SIGKILLed on both tries: its MLflow run must end KILLED.
And the MLflow server goes down and a digits run must fail before training, naming the URI.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from stratoflow.config import locations, names
from stratoflow.distributed.processes import group_members
from stratoflow.services import Stack
from stratoflow.services.airflow_api import AirflowApi, AirflowApiError
from stratoflow.services.config import (
    ADMIN_USER,
    HOST,
    MLFLOW,
    MLFLOW_SERVICE_USER,
    POSTGRES,
    SCHEDULER,
)
from tests.integration.services.stack import LiveStack, unpause_and_cancel_the_missed_slot
from tests.support.file_modes import exposed_paths
from tests.support.processes import restorable_epoch

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise

MNIST = "retrain_mnist"
DIGITS = "retrain_digits"
REFRESH_DIGITS = names.refresh_dag_id("stratoflow_digits")
MNIST_CONF = {"strategy": "mirrored", "replicas": 2, "epochs": 2}
# Below pytest's 900 s timeout, so that a stuck run fails with what it was stuck on.
RUN_TIMEOUT_S = 780
EPOCH_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second")


# ----- security --------------------------------------------------------------------------------


def test_anonymous_or_wrong_password_requests_are_refused(live: LiveStack) -> None:
    runs_before = len(live.api.runs(MNIST))
    anonymous = httpx.post(
        f"{live.api_url}/api/v2/dags/{MNIST}/dagRuns",
        json={"logical_date": None, "conf": {}},
        timeout=30,
    )
    assert anonymous.status_code in (401, 403), anonymous.text
    assert httpx.get(f"{live.api_url}/api/v2/dags", timeout=30).status_code in (401, 403)
    forged = httpx.get(
        f"{live.api_url}/api/v2/dags", headers={"Authorization": "Bearer x.y.z"}, timeout=30
    )
    assert forged.status_code in (401, 403)
    wrong = httpx.post(
        f"{live.api_url}/auth/token",
        json={"username": ADMIN_USER, "password": "not-the-password"},
        timeout=30,
    )
    assert wrong.status_code == 401
    assert len(live.api.runs(MNIST)) == runs_before


def test_every_server_listens_on_loopback_only(live: LiveStack) -> None:
    listening = []
    for component, pids in live.stack.pids().items():
        for pid in pids:
            try:
                connections = psutil.Process(pid).net_connections(kind="inet")
            except psutil.NoSuchProcess:
                continue
            listening += [
                (component, c.laddr.ip, c.laddr.port)
                for c in connections
                if c.status == psutil.CONN_LISTEN
            ]
    assert live.stack.config is not None
    ports = {port for _, _, port in listening}
    assert set(live.stack.config.ports.values()) <= ports
    assert {ip for _, ip, _ in listening} == {HOST}, listening


def test_the_metadatabase_bounds_how_long_a_transaction_may_stay_idle(live: LiveStack) -> None:
    """A scheduler SIGKILLed mid-transaction leaves its executor's workers holding its
    connection; without a server-side bound its row locks on `dag_run` stay, and the next
    scheduler skips those runs forever (seen in CI: the live runs below never finished)."""
    import psycopg2

    config = live.stack.config
    assert config is not None
    connection = psycopg2.connect(
        host=HOST,
        port=config.ports[POSTGRES],
        user="airflow",
        password=config.database_password("airflow"),
        dbname="airflow",
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            assert cursor.fetchone() == ("1min",)
    finally:
        connection.close()


def test_secrets_are_generated_into_the_state_folder_readable_by_the_owner_only(
    live: LiveStack,
) -> None:
    state = live.stack.state_dir
    secrets = json.loads((state / "secrets.json").read_text())
    assert len(set(secrets.values())) == len(secrets)  # all different
    assert all(len(value) >= 24 for value in secrets.values())
    for name in ("secrets.json", "services.json", "mlflow_auth.ini"):
        assert (state / name).stat().st_mode & 0o077 == 0, name


# ----- triggering over REST --------------------------------------------------------------------


def test_an_invalid_strategy_is_refused_with_400_and_creates_no_run(live: LiveStack) -> None:
    runs_before = len(live.api.runs(MNIST))
    with pytest.raises(AirflowApiError) as refused:
        live.api.trigger(MNIST, {**MNIST_CONF, "strategy": "bogus"})
    assert refused.value.status_code == 400
    message = str(refused.value)
    assert "strategy" in message and "'mirrored'" in message and "'one_device'" in message
    assert len(live.api.runs(MNIST)) == runs_before


@dataclass
class LiveRuns:
    """What happened to the DAG runs that went on together, faults included."""

    mnist_run_id: str = ""
    mnist_seconds: float = 0.0
    scheduled_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    scheduler_killed_during: dict[str, Any] = field(default_factory=dict)
    scheduler_pids: tuple[int, int] = (0, 0)  # the killed one, its successor
    refresh_run_id: str = ""
    digits_run_id: str = ""
    digits_seconds: float = 0.0
    killed_training_pid: int = 0
    killed_after_epochs: int = 0
    final: dict[str, dict[str, Any]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def live_runs(live: LiveStack) -> LiveRuns:
    """Trigger the mnist run and the digits refresh together; inject the faults as they run."""
    api, record = live.api, LiveRuns()
    for dag_id in (MNIST, DIGITS):
        record.scheduled_runs[dag_id] = unpause_and_cancel_the_missed_slot(api, dag_id)
    # The refresh re-prepares the same digits, and an asset-triggered run with nothing new since
    # the champion skips training (docs/guide/unattended-runs.md): the earlier modules' digits
    # champion goes, so that the run this module kills a training process of trains.
    with contextlib.suppress(Exception):  # no champion yet
        live.mlflow().delete_registered_model_alias("stratoflow-digits", "champion")
    api.set_paused(REFRESH_DIGITS, False)

    started = time.monotonic()
    record.mnist_run_id = api.trigger(MNIST, MNIST_CONF)["dag_run_id"]
    record.refresh_run_id = api.trigger(REFRESH_DIGITS)["dag_run_id"]
    digits_started = 0.0
    deadline = started + RUN_TIMEOUT_S
    while len(record.final) < 2:
        assert time.monotonic() < deadline, _stuck(live, record)
        mnist_tasks = _task_states(api, MNIST, record.mnist_run_id)
        if not record.scheduler_killed_during and mnist_tasks.get("train_model") == "running":
            record.scheduler_pids = _restart_scheduler(live.stack)
            record.scheduler_killed_during = mnist_tasks
        if not record.digits_run_id:
            triggered = [r for r in api.runs(DIGITS) if r["run_type"] == "asset_triggered"]
            if triggered:
                record.digits_run_id = triggered[0]["dag_run_id"]
                digits_started = time.monotonic()
        elif not record.killed_training_pid:
            _kill_training_after_a_checkpoint(live.stack, record)
        for dag_id, run_id in ((MNIST, record.mnist_run_id), (DIGITS, record.digits_run_id)):
            if run_id and dag_id not in record.final:
                run = api.run(dag_id, run_id)
                if run["state"] in ("success", "failed"):
                    record.final[dag_id] = run
                    if dag_id == MNIST:
                        record.mnist_seconds = time.monotonic() - started
                    else:
                        record.digits_seconds = time.monotonic() - digits_started
        time.sleep(0.2 if record.digits_run_id and not record.killed_training_pid else 2)
    log.info(
        "services: REST mnist run %.0f s (scheduler restarted during it); asset-triggered "
        "digits run %.0f s (training killed once)",
        record.mnist_seconds,
        record.digits_seconds,
    )
    return record


def _stuck(live: LiveStack, record: LiveRuns) -> str:
    """What a run that did not finish in time was waiting for: every run's task states and the
    scheduler's last log lines."""
    api, lines = live.api, [f"runs not finished in {RUN_TIMEOUT_S} s: {record}"]
    for dag_id in (MNIST, DIGITS, REFRESH_DIGITS):
        for run in api.runs(dag_id):
            states = _task_states(api, dag_id, run["dag_run_id"])
            lines.append(f"{dag_id} {run['dag_run_id']} {run['state']}: {states}")
    assert live.stack.config is not None
    scheduler_log = live.stack.config.logs_dir / f"{SCHEDULER}.log"
    lines += ["scheduler log:", *scheduler_log.read_text(errors="replace").splitlines()[-60:]]
    return "\n".join(lines)


def _task_states(api: AirflowApi, dag_id: str, run_id: str) -> dict[str, str | None]:
    return {t["task_id"]: t["state"] for t in api.task_instances(dag_id, run_id)}


def _restart_scheduler(stack: Stack) -> tuple[int, int]:
    """A scheduler crash: SIGKILL its main process, then start a new scheduler; both PIDs."""
    killed = stack.processes[SCHEDULER].pid
    stack.stop_component(SCHEDULER, kill=True)
    stack.start_component(SCHEDULER)
    return killed, stack.processes[SCHEDULER].pid


def _kill_training_after_a_checkpoint(stack: Stack, record: LiveRuns) -> None:
    """SIGKILL the digits run's training process once it has checkpointed an epoch or two.

    The process is found by its payload's run folder, which lies in this stack's state folder:
    no other process on the machine can match.
    """
    run_dir = locations.run_dir(DIGITS, record.digits_run_id, stack.state_dir)
    if not (run_dir / "checkpoints").is_dir():
        return  # training has not begun
    # Epochs now come every fraction of a second: watch closely, without the API polls.
    deadline = time.monotonic() + 60
    while (epoch := restorable_epoch(run_dir)) < 2:
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "stratoflow.training.worker" not in cmdline:
            continue
        try:
            payload_path = Path(cmdline[cmdline.index("stratoflow.training.worker") + 1])
            payload = json.loads(payload_path.read_text())
        except (OSError, ValueError, IndexError):
            continue
        if Path(payload["run_dir"]) == run_dir:
            process.kill()
            record.killed_training_pid = process.pid
            record.killed_after_epochs = epoch
            return


def test_rest_triggered_mnist_run_tracks_every_epoch_and_registers_a_version(
    live: LiveStack, live_runs: LiveRuns
) -> None:
    api, run_id = live.api, live_runs.mnist_run_id
    run = live_runs.final[MNIST]
    assert run["state"] == "success", _task_states(api, MNIST, run_id)
    assert run["run_type"] == "manual" and run["conf"] == MNIST_CONF
    # The task log, read through the API, shows the strategy and both epochs.
    train_log = api.task_log(MNIST, run_id, "train_model", 1)
    assert "epoch 2/2" in train_log and "epoch 1/2" in train_log
    assert api.xcom(MNIST, run_id, "train_model")["num_replicas"] == 2

    mlflow = live.mlflow()
    (mlflow_run,) = mlflow.search_runs(
        [mlflow.get_experiment_by_name("stratoflow/mnist").experiment_id],
        filter_string=f"tags.`airflow.run_id` = '{run_id}'",
    )
    assert mlflow_run.info.status == "FINISHED"
    # Made by the tasks' MLflow account, triggered by the Airflow user whose token it was.
    assert mlflow_run.info.user_id == MLFLOW_SERVICE_USER
    assert mlflow_run.data.tags["airflow.triggered_by"] == ADMIN_USER
    assert mlflow_run.data.tags["strategy"] == "mirrored"
    assert mlflow_run.data.tags["num_replicas"] == "2"
    for key in EPOCH_METRICS:
        steps = [m.step for m in mlflow.get_metric_history(mlflow_run.info.run_id, key)]
        assert sorted(steps) == [1, 2], key
    version = mlflow_run.data.tags[names.VERSION_TAG]
    registered = mlflow.get_model_version("stratoflow-mnist", version)
    assert registered.run_id == mlflow_run.info.run_id
    assert "challenger" in registered.aliases
    gate_passed = mlflow_run.data.tags["gate.passed"] == "True"
    assert ("champion" in registered.aliases) == gate_passed
    # The model's artifacts went through the tracking server into its artifact folder.
    assert list((live.stack.state_dir / "mlartifacts").rglob("MLmodel"))


def test_unpausing_a_retrain_dag_runs_its_latest_cron_slot(live_runs: LiveRuns) -> None:
    for dag_id in (MNIST, DIGITS):
        scheduled = live_runs.scheduled_runs[dag_id]
        assert scheduled["dag_run_id"].startswith("scheduled__")
        assert scheduled["logical_date"] is not None


def test_a_scheduler_killed_mid_run_loses_no_run(live: LiveStack, live_runs: LiveRuns) -> None:
    assert live_runs.scheduler_killed_during.get("train_model") == "running"
    killed, successor = live_runs.scheduler_pids
    assert killed != successor and not _alive(killed)
    assert live.stack.running().count(SCHEDULER) == 1
    assert live_runs.final[MNIST]["state"] == "success"
    states = _task_states(live.api, MNIST, live_runs.mnist_run_id)
    assert set(states.values()) == {"success"}, states
    health = httpx.get(f"{live.api_url}/api/v2/monitor/health", timeout=30).json()
    assert health["scheduler"]["status"] == "healthy"


def test_a_refresh_emits_the_dataset_asset_and_the_scheduler_starts_the_retrain(
    live: LiveStack, live_runs: LiveRuns
) -> None:
    api = live.api
    refresh = api.run(REFRESH_DIGITS, live_runs.refresh_run_id)
    assert refresh["state"] == "success"
    digits = live_runs.final[DIGITS]
    assert digits["run_type"] == "asset_triggered"
    events = api.request(
        "GET", f"/api/v2/dags/{DIGITS}/dagRuns/{live_runs.digits_run_id}/upstreamAssetEvents"
    )["asset_events"]
    (event,) = events
    assert event["uri"] == names.asset_uri("stratoflow_digits")
    assert event["source_dag_id"] == REFRESH_DIGITS
    assert event["source_run_id"] == live_runs.refresh_run_id
    assert event["extra"]["dataset"] == "stratoflow_digits"
    assert len(event["extra"]["versions"]["1.0.0"]["fingerprint"]) == 64


def test_a_killed_training_process_is_restarted_inside_the_task_from_its_checkpoint(
    live: LiveStack, live_runs: LiveRuns
) -> None:
    """The run's default `max_restarts` (2): the launcher restarts the lost training process
    from its last checkpoint within the same Airflow try, and counts it in MLflow."""
    api, run_id = live.api, live_runs.digits_run_id
    assert live_runs.killed_training_pid, "the training process was never seen after a checkpoint"
    assert live_runs.final[DIGITS]["state"] == "success", _task_states(api, DIGITS, run_id)
    train = api.task_instance(DIGITS, run_id, "train_model")
    assert train["try_number"] == 1
    log = api.task_log(DIGITS, run_id, "train_model", 1)
    assert "was killed by SIGKILL" in log and "restart 1/2" in log, log[-3000:]
    assert "resuming at epoch" in log
    result = api.xcom(DIGITS, run_id, "train_model")
    assert result["resumed_from_epoch"] >= live_runs.killed_after_epochs >= 2
    epochs = result["epochs"]
    mlflow = live.mlflow()
    (mlflow_run,) = mlflow.search_runs(
        [mlflow.get_experiment_by_name("stratoflow/digits").experiment_id],
        filter_string=f"tags.`airflow.run_id` = '{run_id}'",
    )
    assert mlflow_run.info.status == "FINISHED"
    # No user triggered it: the tag holds the run's type.
    assert mlflow_run.data.tags["airflow.triggered_by"] == "(asset_triggered)"
    assert mlflow_run.data.metrics["restarts"] == 1
    assert mlflow_run.data.metrics["recovery_seconds"] > 0
    for key in EPOCH_METRICS:  # each epoch exactly once, across both training processes
        steps = [m.step for m in mlflow.get_metric_history(mlflow_run.info.run_id, key)]
        assert sorted(steps) == list(range(1, epochs + 1)), key


def test_everything_the_stack_wrote_is_its_owners_only(
    live: LiveStack, live_runs: LiveRuns
) -> None:
    """After the runs above (task logs, checkpoints, MLflow artifacts, the stack's own logs):
    no file or folder in the state folder lets another user read, write or list it. Run as
    root, the folder itself lets the postgres OS user pass through to its cluster."""
    from stratoflow.services import postgres

    assert live_runs.final, "no DAG run went on"
    state = live.stack.state_dir
    assert list((state / "mlartifacts").rglob("MLmodel")), "no model artifact to check"
    assert list((state / "airflow" / "logs").rglob("*.log")), "no task log to check"
    offenders = exposed_paths(state, passable_root=bool(postgres.as_server_user()))
    assert offenders == [], f"{len(offenders)} open to others:\n" + "\n".join(offenders[:40])


# ----- a task process killed for good ----------------------------------------------------------


def test_a_task_process_killed_on_every_try_leaves_no_mlflow_run_running(live: LiveStack) -> None:
    """SIGKILL the train_model task process (the pid Airflow records) on both tries.

    Airflow 3.3 runs no task failure callback then: the task's supervisor reports it failed
    (up_for_retry, then failed). The DAG run fails, and its failure callback, which the DAG
    processor runs, must end the MLflow run KILLED.
    """
    api = live.api
    if api.dag(DIGITS)["is_paused"]:  # when run alone, without the `live_runs` fixture
        unpause_and_cancel_the_missed_slot(api, DIGITS)
    run_id = api.trigger(DIGITS, {"epochs": 1000})["dag_run_id"]
    mlflow = live.mlflow()
    killed: list[int] = []
    epochs_seen = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(killed) < 2:
        assert time.monotonic() < deadline, _task_states(api, DIGITS, run_id)
        train = api.task_instance(DIGITS, run_id, "train_model")
        mlflow_run = _mlflow_run_of(mlflow, "digits", run_id)
        epochs = _logged_epochs(mlflow, mlflow_run)
        if (
            train["state"] == "running"
            and train["try_number"] == len(killed) + 1
            and train["pid"]
            and epochs > epochs_seen  # this try is training
        ):
            psutil.Process(train["pid"]).kill()
            killed.append(train["pid"])
            epochs_seen = epochs
        time.sleep(0.5)
    last_kill = time.monotonic()
    run = api.wait_for_run(DIGITS, run_id, timeout_seconds=300)
    failed_after = time.monotonic() - last_kill
    assert run["state"] == "failed"
    train = api.task_instance(DIGITS, run_id, "train_model")
    assert (train["state"], train["try_number"]) == ("failed", 2)
    # The DAG processor runs the DAG run's failure callback a few seconds later.
    callback_deadline = time.monotonic() + 180
    while (status := _mlflow_run_of(mlflow, "digits", run_id).info.status) == "RUNNING":
        assert time.monotonic() < callback_deadline, "the MLflow run stayed RUNNING"
        time.sleep(1)
    assert status == "KILLED"
    log.info(
        "services: task process killed on try 2; DAG run failed %.0f s later, MLflow run KILLED "
        "%.0f s after the kill",
        failed_after,
        time.monotonic() - last_kill,
    )
    assert not locations.run_dir(DIGITS, run_id, live.stack.state_dir).exists()
    assert [pid for pid in killed if _alive(pid)] == []


def _mlflow_run_of(mlflow: Any, pipeline: str, run_id: str) -> Any:
    experiment = mlflow.get_experiment_by_name(f"stratoflow/{pipeline}")
    if experiment is None:  # no run of the pipeline yet on this stack
        return None
    runs = mlflow.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`airflow.run_id` = '{run_id}'"
    )
    return runs[0] if runs else None


def _logged_epochs(mlflow: Any, mlflow_run: Any) -> int:
    if mlflow_run is None:
        return 0
    history = mlflow.get_metric_history(mlflow_run.info.run_id, "loss")
    return max((metric.step for metric in history), default=0)


# ----- MLflow down -----------------------------------------------------------------------------


def test_with_mlflow_down_a_run_fails_before_training_naming_the_uri_and_registers_nothing(
    live: LiveStack, live_runs: LiveRuns
) -> None:
    api, stack = live.api, live.stack
    assert DIGITS in live_runs.final  # the digits DAG is unpaused and idle
    mlflow = live.mlflow()
    versions_before = {v.version for v in mlflow.search_model_versions("name='stratoflow-digits'")}
    stack.stop_component(MLFLOW)
    try:
        run_id = api.trigger(DIGITS, {"epochs": 1})["dag_run_id"]
        run = api.wait_for_run(DIGITS, run_id, timeout_seconds=300)
    finally:
        stack.start_component(MLFLOW)
        stack.wait_healthy(MLFLOW, time.monotonic() + 180)
    states = _task_states(api, DIGITS, run_id)
    assert run["state"] == "failed"
    assert states["prepare_dataset"] == "failed"
    assert states["train_model"] == "upstream_failed"  # training never started
    for attempt in (1, 2):
        log = api.task_log(DIGITS, run_id, "prepare_dataset", attempt)
        assert f"MLflow at {live.mlflow_uri} is unreachable" in log, log[-2000:]
    assert not mlflow.search_runs(
        [mlflow.get_experiment_by_name("stratoflow/digits").experiment_id],
        filter_string=f"tags.`airflow.run_id` = '{run_id}'",
    )
    versions_after = {v.version for v in mlflow.search_model_versions("name='stratoflow-digits'")}
    assert versions_after == versions_before
    assert not locations.run_dir(DIGITS, run_id, stack.state_dir).exists()


# ----- stop ------------------------------------------------------------------------------------


def test_down_stops_every_process_of_the_stack(live: LiveStack) -> None:
    pids = [pid for group in live.stack.pids().values() for pid in group]
    # What the killed scheduler left behind is the stack's too.
    pids += [m.pid for p in live.stack.retired for m in group_members(p.pid, exclude=set())]
    assert pids
    live.stack.down()
    assert [pid for pid in pids if _alive(pid)] == []
    assert live.stack.running() == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
