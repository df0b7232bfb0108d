"""The strategy benchmark DAG run whole through Airflow (`airflow dags test`, as `stratoflow
benchmark` does) on the digits pipeline, into a fresh MLflow store: one_device, mirrored and
multi-worker mirrored train for real, and tpu (no TPU here) fails without sinking the benchmark."""

from __future__ import annotations

import contextlib
import io
import sqlite3

import pytest

from stratoflow.cli import runner
from stratoflow.config import locations, names
from stratoflow.services import airflow_setup
from tests.conftest import fresh_mlflow_client

pytestmark = pytest.mark.integration

STRATEGIES = ["one_device", "mirrored", "multi_worker_mirrored", "tpu"]
TRAINED = STRATEGIES[:3]
EPOCH_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second")


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-benchmark")


@pytest.fixture(scope="module")
def benchmark(mlflow_client):
    """Run the benchmark once; return its exit code, what it printed, its parent and children."""

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = runner.run_benchmark("digits", {"epochs": 2, "strategies": STRATEGIES})
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name("digits"))
    (parent,) = mlflow_client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{names.KIND_TAG}` = '{names.BENCHMARK_PARENT_KIND}'",
    )
    children = mlflow_client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    )
    return code, printed.getvalue(), parent, {c.data.tags["strategy"]: c for c in children}


def test_the_benchmark_succeeds_and_recommends_a_strategy_that_ran(benchmark):
    code, printed, parent, _ = benchmark
    assert code == 0
    assert parent.info.status == "FINISHED"
    tags = parent.data.tags
    assert tags["airflow.dag_id"] == "benchmark_strategies_digits"
    assert tags["airflow.run_id"].startswith("manual__")
    assert tags["mlflow.runName"] == f"digits-bench-{tags['airflow.run_id']}"
    assert tags["stratoflow.recommended_strategy"] in TRAINED
    assert "examples/s" in tags["stratoflow.recommendation_reason"]
    assert f"Recommended for this host: {tags['stratoflow.recommended_strategy']}" in printed
    for label in ("one_device ", "mirrored (2 logical CPUs)", "multi_worker_mirrored (2 workers)"):
        assert any(line.startswith(label) for line in printed.splitlines()), label
    assert "failed: tpu: StrategyUnavailableError" in printed


def test_one_child_run_per_strategy_with_per_epoch_metrics(benchmark, mlflow_client):
    _, _, parent, children = benchmark
    assert sorted(children) == sorted(STRATEGIES)
    for strategy in TRAINED:
        child = children[strategy]
        assert child.info.status == "FINISHED", strategy
        assert child.data.tags["mlflow.runName"] == f"digits-bench-{strategy}"
        assert child.data.tags["stratoflow.kind"] == "strategy_benchmark_run"
        assert child.data.params["training.epochs"] == "2"
        for key in EPOCH_METRICS:
            history = mlflow_client.get_metric_history(child.info.run_id, key)
            assert sorted(m.step for m in history) == [1, 2], (strategy, key)
        assert child.data.metrics["test_accuracy"] > 0.8, strategy
        assert child.data.metrics["train_seconds"] > 0, strategy
    assert children["mirrored"].data.tags["num_replicas"] == "2"
    assert children["multi_worker_mirrored"].data.tags["num_workers"] == "2"
    tpu = children["tpu"]
    assert tpu.info.status == "FAILED"
    assert "no TPU is attached to this host" in tpu.data.tags["stratoflow.error"]


def test_the_comparison_artifact_lists_every_strategy(benchmark, mlflow_client):
    import mlflow

    _, _, parent, children = benchmark
    run_id = parent.info.run_id
    comparison = mlflow.artifacts.load_dict(f"runs:/{run_id}/benchmark/comparison.json")
    rows = {row["strategy"]: row for row in comparison["strategies"]}
    assert list(rows) == STRATEGIES
    for strategy in TRAINED:
        row = rows[strategy]
        assert row["status"] == "succeeded"
        assert row["mlflow_run_id"] == children[strategy].info.run_id
        assert row["examples_per_second"] > 0 and row["seconds_to_first_step"] > 0
        assert row["test_accuracy"] == children[strategy].data.metrics["test_accuracy"]
    assert rows["tpu"]["status"] == "failed" and "no TPU" in rows["tpu"]["error"]
    assert (
        comparison["recommendation"]["strategy"]
        == parent.data.tags["stratoflow.recommended_strategy"]
    )
    assert comparison["threshold"] == 0.9  # the digits gate
    artifacts = {a.path for a in mlflow_client.list_artifacts(run_id, "benchmark")}
    assert artifacts == {
        "benchmark/plan.json",
        "benchmark/comparison.json",
        "benchmark/comparison.md",
        "benchmark/comparison_table.json",
    }


def test_a_failed_strategy_does_not_fail_the_dag_run(benchmark):
    _, _, parent, _ = benchmark
    dag_id, run_id = "benchmark_strategies_digits", parent.data.tags["airflow.run_id"]
    db = airflow_setup.airflow_home() / "airflow.db"
    with contextlib.closing(sqlite3.connect(db)) as connection:
        states = dict(
            connection.execute(
                "SELECT coalesce(rendered_map_index, task_id), state FROM task_instance "
                "WHERE dag_id = ? AND run_id = ?",
                (dag_id, run_id),
            ).fetchall()
        )
        (dag_run_state,) = connection.execute(
            "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
        ).fetchone()
    assert states == {
        "plan_strategies": "success",
        "one_device": "success",
        "mirrored": "success",
        "multi_worker_mirrored": "success",
        "tpu": "failed",
        "compare_strategies": "success",
    }
    assert dag_run_state == "success"


def test_the_benchmark_registers_nothing_and_keeps_no_model(benchmark, mlflow_client):
    _, _, parent, _ = benchmark
    assert list(mlflow_client.search_model_versions("name = 'stratoflow-digits'")) == []
    assert list(mlflow_client.search_registered_models()) == []
    dag_run_dir = locations.run_dir(
        "benchmark_strategies_digits", parent.data.tags["airflow.run_id"]
    )
    assert not dag_run_dir.exists() or not any(dag_run_dir.rglob("*.keras"))
