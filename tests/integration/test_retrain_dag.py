"""Whole DAG runs through Airflow (`airflow dags test`, as `make run` does) into a fresh MLflow
store: the default mnist run, a worse run that must not take the champion alias, a failing run
that must leave nothing behind, and `stratoflow compare` over what they produced."""

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

import pytest

from pipelines import cli, runner, settings

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def fresh_tracking_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield


@pytest.fixture(scope="module")
def mlflow_client(fresh_tracking_store):
    from tasks import tracking

    return tracking.client()


def mlflow_runs(mlflow_client, pipeline: str):
    from tasks import tracking

    experiment = mlflow_client.get_experiment_by_name(tracking.experiment_name(pipeline))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time ASC"]
    )


def metric_steps(mlflow_client, run_id: str, key: str) -> list[int]:
    return sorted(metric.step for metric in mlflow_client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def default_mnist_run(mlflow_client, capsys_module):
    code = runner.run_pipeline("mnist", {})
    return code, capsys_module()


@pytest.fixture(scope="module")
def capsys_module():
    """What the runner printed (it writes its summary to stdout), captured per module."""
    import io
    import sys

    buffer = io.StringIO()
    original = sys.stdout
    sys.stdout = buffer
    yield buffer.getvalue
    sys.stdout = original


def test_default_mnist_run_trains_evaluates_and_registers_a_champion(
    default_mnist_run, mlflow_client
):
    from tasks import registry

    code, printed = default_mnist_run
    assert code == 0
    (run,) = mlflow_runs(mlflow_client, "mnist")
    assert run.info.status == "FINISHED"
    assert run.data.tags["airflow.dag_id"] == "retrain_mnist"
    assert run.data.tags["airflow.run_id"].startswith("manual__")
    assert run.data.tags["strategy"] == "one_device"
    assert run.data.tags["loop"] == "custom"
    assert run.data.tags["num_replicas"] == "1"
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second"):
        assert metric_steps(mlflow_client, run.info.run_id, key) == list(range(1, 9)), key
    assert run.data.metrics["test_accuracy"] >= 0.95
    assert run.data.params["training.epochs"] == "8"
    assert registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "1",
    }
    assert "DAG run manual__" in printed and "succeeded" in printed
    assert "version 1 (aliases: challenger, champion)" in printed
    assert "mlflow ui --backend-store-uri" in printed


def test_a_worse_run_gets_challenger_but_leaves_champion(default_mnist_run, mlflow_client):
    from tasks import registry

    assert default_mnist_run[0] == 0
    conf = {"strategy": "mirrored", "replicas": 2, "epochs": 1, "learning_rate": 1e-5}
    assert runner.run_pipeline("mnist", conf) == 0
    latest = mlflow_runs(mlflow_client, "mnist")[-1]
    assert latest.data.tags["strategy"] == "mirrored"
    assert latest.data.tags["num_replicas"] == "2"
    assert latest.data.tags["gate.passed"] == "False"
    assert metric_steps(mlflow_client, latest.info.run_id, "loss") == [1]
    assert registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "2",
    }


def test_compare_lists_both_runs_and_marks_the_champion(default_mnist_run, mlflow_client, capsys):
    assert cli.main(["compare", "mnist", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["strategy"] for row in rows] == ["mirrored", "one_device"]  # newest first
    assert [row["champion"] for row in rows] == [False, True]
    assert rows[1]["test_accuracy"] >= 0.95
    assert all(row["examples_per_second"] > 0 and row["duration_s"] > 0 for row in rows)
    assert cli.main(["compare", "mnist"]) == 0
    table = capsys.readouterr().out
    assert "mirrored" in table and cli.CHAMPION_MARKER in table


def test_a_run_that_fails_for_good_leaves_nothing_behind(mlflow_client):
    """No TPU here: both tries of train_model fail, and the failure callback cleans up."""
    assert runner.run_pipeline("digits", {"strategy": "tpu"}) == 1
    (run,) = mlflow_runs(mlflow_client, "digits")
    assert run.info.status == "FAILED"
    assert run.data.tags["airflow.try_number"] == "2"  # the retry reused the DAG run's MLflow run
    assert list(mlflow_client.search_model_versions("name = 'stratoflow-digits'")) == []
    dag_run_dir = settings.run_dir("retrain_digits", run.data.tags["airflow.run_id"])
    assert not dag_run_dir.exists()


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
    home = runner.airflow_home()
    env = runner.airflow_env(home)
    runner.ensure_airflow_db(home, env)
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


def runs_of_dag_run(mlflow_client, pipeline: str, run_id: str) -> list[Any]:
    from tasks import tracking

    experiment = mlflow_client.get_experiment_by_name(tracking.experiment_name(pipeline))
    if experiment is None:
        return []
    return [
        run
        for run in mlflow_client.search_runs([experiment.experiment_id])
        if run.data.tags.get("airflow.run_id") == run_id
    ]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"strategy": "mirrored", "replicas": 2, "batch_size": 33},
            "run conf.batch_size 33 must be divisible by replicas 2",
        ),
        # digits' MLP has Dropout: refused from the spec, no longer by the training process.
        ({"strategy": "central_storage"}, "run conf.strategy 'central_storage' cannot train"),
    ],
    ids=["batch_size", "central_storage"],
)
def test_a_conf_the_spec_refuses_fails_in_prepare_at_once_without_an_mlflow_run(
    mlflow_client, conf: dict[str, Any], message: str
) -> None:
    run_id = f"refused__{time.time_ns()}"
    # The digits spec retries once after 10 s: a retried refusal would show 2 tries.
    result = dags_test("retrain_digits", conf, run_id)

    assert result.returncode != 0
    assert result.state == "failed"
    assert result.tries == {"prepare_dataset": 1}, result.output[-3000:]
    assert "AirflowFailException" in result.output
    assert message in result.output
    assert runs_of_dag_run(mlflow_client, "digits", run_id) == []


def test_a_failed_run_with_id_dot_removes_its_own_folder_and_no_other(mlflow_client) -> None:
    """Run id "." (Airflow accepts it) fails in prepare_dataset; the clean-up that follows must
    not take the DAG's other runs' folders with it."""
    dag_id = "retrain_digits"
    others = ["manual__2026-12-02T19:02:11+00:00", "manual__2026-12-02T19_02_11_00_00", "a.b"]
    for other in [*others, "."]:
        folder = settings.run_dir(dag_id, other)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.keras").write_text(other)

    result = dags_test(dag_id, {"strategy": "mirrored", "replicas": 2, "batch_size": 33}, ".")

    assert result.state == "failed", result.output[-3000:]
    for other in others:
        assert (settings.run_dir(dag_id, other) / "model.keras").read_text() == other
    assert not settings.run_dir(dag_id, ".").exists()  # the clean-up ran, for this run
    assert result.tries == {"prepare_dataset": 1}
