"""Multi-process strategies with real worker, ps and coordinator processes on loopback.

Fault tests SIGKILL a real cluster member mid-training and check that the task recovers inside
the same try (a parameter-server worker rejoins, any other loss restarts the cluster from its
checkpoint), or, with no restart allowed, fails fast, leaves no process and no scratch folder
behind, and that the retry resumes with every epoch logged exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from pathlib import Path

import pytest

from stratoflow.config import locations, names
from stratoflow.config.spec import ModelSpec, load_spec
from stratoflow.tasks.run_context import AirflowRun
from tests.support.processes import (
    SPARE_MODULE,
    cluster_children,
    cluster_member,
    kill_during,
    leftovers,
    restorable_epoch,
    tf_config_of,
)

pytestmark = pytest.mark.integration

# docs/how-to/strategies.md, "Supervision": a dead member fails the task at once (measured
# 0.2-0.3 s). The bound leaves room for a slow CI machine and catches a launcher that leaves it to
# the chief, whose collective fails only about 10 s later (docs/BENCHMARKS.md, "Facts").
KILL_DEADLINE_SECONDS = 3
# The fault tests kill a member once the first checkpoint exists. digits' MLP trains an epoch in
# about a second under these strategies (mnist's CNN: 10-25 s), so enough epochs leave the kill
# time to land mid-run. A rejoining parameter-server worker is the exception: it imports
# TensorFlow (15-40 s) while training goes on, so that test keeps mnist.
FAULT_PIPELINE = "digits"
FAULT_EPOCHS = 12


def new_run(pipeline: str) -> AirflowRun:
    return AirflowRun(dag_id=f"retrain_{pipeline}", run_id=f"manual__{uuid.uuid4().hex[:12]}")


def losses(history) -> list[float]:
    return [entry["loss"] for entry in history]


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_cluster_strategies_train_through_the_task_api(tf_runtime, private_tmpdir, strategy):
    from stratoflow.tasks import evaluate, prepare, train
    from stratoflow.tracking import mlflow_runs

    run = new_run("digits")
    # Streamed (cache budget 0): the workers read the files themselves, each epoch. The cached
    # input under these strategies is what the fault tests below and
    # test_strategies_equivalence.py train on.
    params = {"strategy": strategy, "workers": 2, "ps": 1, "epochs": 4, "cache_budget_mb": 0}
    prepared = prepare.prepare("digits", params, run)
    trained = train.train(run, prepared)
    evaluated = evaluate.evaluate(run, prepared, trained)

    assert trained.num_workers == 2
    history = mlflow_runs.client().get_metric_history(trained.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # logged by the chief only, once
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert values[-1] < values[0]
    assert evaluated.test_metrics["test_accuracy"] > 0.85
    assert cluster_children() == []
    # The chief describes the cluster it trained in: its jobs, their addresses, its own task.
    environment = mlflow_runs.client().download_artifacts(
        trained.mlflow_run_id, names.ENVIRONMENT_ARTIFACT
    )
    cluster = json.loads(Path(environment).read_text())["cluster"]
    assert (cluster["workers"], cluster["ps"]) == (2, 1 if strategy == "parameter_server" else 0)
    assert len(cluster["jobs"]["worker"]) == 2
    assert all(address.startswith("127.0.0.1:") for address in cluster["jobs"]["worker"])
    assert cluster["task"] == (
        {"type": "chief", "index": 0}
        if strategy == "parameter_server"
        else {"type": "worker", "index": 0}
    )
    assert leftovers(private_tmpdir) == []  # no child work folder, no worker scratch
    if strategy == "multi_worker_mirrored":
        # Only the chief writes checkpoints, into the run folder.
        checkpoints = locations.run_dir(run.dag_id, run.run_id) / "checkpoints"
        assert sorted(p.name for p in checkpoints.glob("ckpt-*.index")) == [
            "ckpt-3.index",
            "ckpt-4.index",
        ]


# The tabular pipelines' data and models (dicts of columns, a regression target) under the
# cluster strategies; one pipeline each keeps the suite short: the other pairs share the code.
@pytest.mark.parametrize(
    ("pipeline", "strategy"),
    [("penguins", "parameter_server"), ("diabetes", "multi_worker_mirrored")],
)
def test_tabular_pipelines_train_under_the_cluster_strategies(
    tf_runtime, private_tmpdir, pipeline, strategy
):
    from stratoflow.tasks import evaluate, prepare, train
    from stratoflow.tracking import mlflow_runs

    run = new_run(pipeline)
    params = {"strategy": strategy, "workers": 2, "ps": 1, "epochs": 20}
    prepared = prepare.prepare(pipeline, params, run)
    trained = train.train(run, prepared)
    evaluated = evaluate.evaluate(run, prepared, trained)

    metric = "val_accuracy" if pipeline == "penguins" else "val_mae"
    history = mlflow_runs.client().get_metric_history(trained.mlflow_run_id, metric)
    assert sorted(m.step for m in history) == list(range(1, 21))
    if pipeline == "penguins":
        assert evaluated.test_metrics["test_accuracy"] >= 0.9
    else:
        assert evaluated.test_metrics["test_mae"] <= 50.0
    assert evaluated.gate.passed, evaluated.gate.reasons
    assert cluster_children() == []


@pytest.mark.parametrize(
    ("strategy", "victim"),
    [("multi_worker_mirrored", "worker 1"), ("parameter_server", "ps 0")],
)
def test_a_killed_cluster_member_fails_fast_and_the_retry_resumes(
    tf_runtime, private_tmpdir, strategy, victim
):
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import prepare, train
    from stratoflow.tracking import mlflow_runs

    run = new_run(FAULT_PIPELINE)
    params = {
        "strategy": strategy,
        "workers": 2,
        "ps": 1,
        "epochs": FAULT_EPOCHS,
        "seed": 5,
        "max_restarts": 0,
    }
    prepared = prepare.prepare(FAULT_PIPELINE, params, run)
    run_dir = locations.run_dir(run.dag_id, run.run_id)
    job, index = victim.split()
    role = "ps" if job == "ps" else "worker"

    killed = kill_during(
        lambda: train.train(run, prepared),
        when=lambda: restorable_epoch(run_dir) >= 1,
        victim=lambda children: next(
            child
            for child in children
            if (tf_config_of(child) or {}).get("task") == {"type": role, "index": int(index)}
        ),
    )
    assert isinstance(killed.error, ChildProcessFailed)
    assert f"{victim} (pid {killed.victim_pid}) was killed by SIGKILL" in str(killed.error)
    assert killed.seconds_to_failure < KILL_DEADLINE_SECONDS
    assert cluster_children() == []
    # A killed worker cannot clean up after itself: its scratch went with the launcher's folder.
    assert leftovers(private_tmpdir) == []
    print(f"{strategy}: {victim} killed, failed {killed.seconds_to_failure:.2f} s later")  # noqa: T201

    retry = AirflowRun(run.dag_id, run.run_id, try_number=2)
    trained = train.train(retry, prepared)
    assert trained.resumed_from_epoch >= 1
    history = mlflow_runs.client().get_metric_history(trained.mlflow_run_id, "loss")
    # each epoch exactly once
    assert sorted(m.step for m in history) == list(range(1, FAULT_EPOCHS + 1))
    assert cluster_children() == []
    assert leftovers(private_tmpdir) == []


@pytest.mark.parametrize(
    ("strategy", "warm_spares"),
    [
        # A loss restarts every member: both take a spare over (a run without spares restarts
        # the same way, with fresh processes: test_services_stack's default run).
        ("multi_worker_mirrored", True),
        ("parameter_server", False),  # the lost worker alone starts again and rejoins
        ("parameter_server", True),  # ... from a spare
    ],
)
def test_a_killed_member_is_recovered_inside_the_same_try(
    tf_runtime, private_tmpdir, request, strategy, warm_spares
):
    """max_restarts 2 (the default): the same `train` call ends well, each epoch logged once;
    with warm spares, the members that start again are processes that were running before the
    loss, and no spare is left behind."""
    import logging
    import threading
    import time

    from stratoflow.tasks import prepare, train
    from stratoflow.tracking import mlflow_runs

    rejoins = strategy == "parameter_server"
    # A worker rejoining without a spare imports TensorFlow while training goes on: mnist's
    # epochs last long enough (FAULT_PIPELINE).
    pipeline, epochs = (
        ("mnist", 3) if rejoins and not warm_spares else (FAULT_PIPELINE, FAULT_EPOCHS)
    )
    replaced = ["worker 1"] if rejoins else ["worker 0", "worker 1"]
    # Read from the logger itself: Airflow's logging setup keeps these records from caplog.
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    distributed_logger = logging.getLogger("stratoflow.distributed")
    distributed_logger.addHandler(handler)
    distributed_logger.setLevel(logging.INFO)
    request.addfinalizer(lambda: distributed_logger.removeHandler(handler))
    run = new_run(pipeline)
    params = {
        "strategy": strategy,
        "workers": 2,
        "ps": 1,
        "epochs": epochs,
        "seed": 5,
        "warm_spares": warm_spares,
    }
    prepared = prepare.prepare(pipeline, params, run)
    run_dir = locations.run_dir(run.dag_id, run.run_id)
    outcome: dict[str, object] = {}

    def train_keeping_the_error() -> None:
        try:
            outcome["trained"] = train.train(run, prepared)
        except Exception as error:  # raised again below, in the test's own thread
            outcome["error"] = error

    thread = threading.Thread(target=train_keeping_the_error)
    thread.start()

    def spares_started() -> int:
        return sum("starting a warm spare" in line for line in said)

    # Spares start with training; killed before one is warm, a member takes one still importing
    # TensorFlow (how fast a warm one recovers is `make bench`'s: benchmarks/recovery.py).
    spares_wanted = len(replaced) if warm_spares else 0
    deadline = time.monotonic() + 400
    while restorable_epoch(run_dir) < 1 or spares_started() < spares_wanted:
        if "error" in outcome:
            raise AssertionError("training failed before the kill") from outcome["error"]
        assert thread.is_alive() and time.monotonic() < deadline, "no checkpoint before the end"
        time.sleep(0.05)
    spare_pids = {
        child.pid for child in cluster_children() if SPARE_MODULE in " ".join(child.cmdline())
    }
    cluster_member("worker", 1).kill()
    thread.join(600)
    assert not thread.is_alive()
    if "error" in outcome:
        raise AssertionError("training failed after the kill") from outcome["error"]
    trained = outcome["trained"]
    assert isinstance(trained, train.TrainedModel)
    mlflow_client = mlflow_runs.client()
    metrics = mlflow_client.get_run(trained.mlflow_run_id).data.metrics
    assert metrics["restarts"] == 1
    (recovery,) = mlflow_client.get_metric_history(trained.mlflow_run_id, "recovery_seconds")
    assert 0 < recovery.value < 120
    history = mlflow_client.get_metric_history(trained.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, epochs + 1))  # each exactly once
    if rejoins:
        assert trained.resumed_from_epoch == 0  # training went on: no restart from a checkpoint
    else:
        assert trained.resumed_from_epoch >= 1
    started_from_spares = {
        name: int(match.group(1))
        for line in said
        for name in replaced
        if (match := re.fullmatch(rf"{name} started from a spare \(pid (\d+), .*", line))
    }
    if warm_spares:
        assert sorted(started_from_spares) == sorted(replaced)
        assert set(started_from_spares.values()) <= spare_pids  # running before the kill
    else:
        assert started_from_spares == {} and spare_pids == set()
    assert cluster_children() == []  # the unused spares too
    assert leftovers(private_tmpdir) == []
    print(  # noqa: T201
        f"{strategy}, warm spares {warm_spares}: worker 1 killed, training again "
        f"{recovery.value:.1f} s later"
    )


def test_a_worker_that_fails_with_an_error_leaves_no_scratch_folder(tf_runtime, private_tmpdir):
    """Every worker raises after making its scratch folder: a batch larger than the dataset."""
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import prepare, train

    run = new_run("digits")
    params = {"strategy": "multi_worker_mirrored", "workers": 2, "batch_size": 4096}
    prepared = prepare.prepare("digits", params, run)
    with pytest.raises(
        ChildProcessFailed, match="batch_size 4096 exceeds the .* training examples"
    ):
        train.train(run, prepared)
    assert cluster_children() == []
    assert leftovers(private_tmpdir) == []


def test_central_storage_trains_a_model_without_random_layers(tf_runtime, tmp_path):
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.training.trainer import train

    spec = load_spec("digits")
    spec = dataclasses.replace(
        spec,
        model=ModelSpec("mlp", {"hidden_units": [64], "dropout": 0.0}),
        training=dataclasses.replace(
            spec.training, strategy="central_storage", replicas=2, epochs=2, batch_size=64
        ),
    )
    result = train(spec, prepare_dataset(spec.dataset), tmp_path)
    assert result.num_replicas == 2
    assert losses(result.history)[-1] < losses(result.history)[0]
    assert Path(result.model_path).is_file()


def test_central_storage_refuses_random_layers_before_training(tf_runtime, tmp_path):
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.training.trainer import train

    spec = load_spec("digits")  # its MLP has Dropout
    spec = dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, strategy="central_storage")
    )
    with pytest.raises(ValueError, match="cannot train layers that draw random numbers"):
        train(spec, prepare_dataset(spec.dataset), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_a_port_clash_at_start_up_is_retried_with_fresh_ports(tf_runtime):
    """The first layout's ps port is taken by another process: TF's server cannot bind it."""
    import socket

    from stratoflow.distributed import cluster, launcher

    blocker = socket.socket()
    # Loopback is enough: TensorFlow binds 0.0.0.0:PORT, which a 127.0.0.1:PORT listener blocks.
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    layouts: list[cluster.ClusterLayout] = []

    def members() -> list[launcher.Member]:
        port = blocker.getsockname()[1] if not layouts else cluster.free_ports(1)[0]
        layouts.append(cluster.ClusterLayout({"ps": [f"127.0.0.1:{port}"]}))
        env = {"TF_CONFIG": layouts[-1].tf_config("ps", 0)}
        return [
            launcher.Member("ps 0", "stratoflow.distributed.server", env, server=True),
            # Outlives the ps's start-up, so a clash is seen before the result is in.
            launcher.Member("result", "tests.support.echo_program"),
        ]

    try:
        # Announced: a ps that is up in seconds (bytecode compiled) must not time the result out.
        result = launcher.run_cluster(
            members, "result", {"value": 1, "sleep": 40, "announce": True}
        )
    finally:
        blocker.close()
    assert result == {"value": 2}
    assert len(layouts) == 2
    assert cluster_children() == []
