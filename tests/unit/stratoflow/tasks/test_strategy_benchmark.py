"""The benchmark's task bodies on a real MLflow store and the digits dataset, where no training
process is needed: strategies that cannot run, a training task that died, a re-run strategy, and
a benchmark in which nothing succeeded. (Real trainings: tests/integration/test_benchmark_dag.py.)
"""

from __future__ import annotations

import json

import pytest

from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import resolve_variant
from stratoflow.config.training import check_training
from stratoflow.tasks import strategy_benchmark
from stratoflow.tasks.run_context import AirflowRun
from tests.conftest import fresh_mlflow_client
from tests.support.calls import counting_calls

DAG_ID = "benchmark_strategies_digits"


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    """A fresh store for this module (each test uses its own DAG run id within it)."""
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-benchmark-steps")


def children_of(mlflow_client, parent_run_id):
    experiment = mlflow_client.get_run(parent_run_id).info.experiment_id
    return mlflow_client.search_runs(
        [experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
    )


def test_when_nothing_succeeds_the_parent_fails_and_the_comparison_says_why(mlflow_client):
    import mlflow

    from stratoflow.training.strategies import StrategyUnavailableError

    run = AirflowRun(DAG_ID, "manual__nothing")
    params = {"epochs": 1, "strategies": ["tpu"]}
    planned = strategy_benchmark.plan("digits", params, run)
    (entry,) = planned
    assert entry.strategy == "tpu" and entry.unavailable and "no TPU" in entry.unavailable

    with pytest.raises(StrategyUnavailableError, match="strategy 'tpu' cannot run on this host"):
        strategy_benchmark.train_strategy(run, entry)
    with pytest.raises(RuntimeError, match="no strategy succeeded: tpu: StrategyUnavailable"):
        strategy_benchmark.compare("digits", run, planned)

    parent = mlflow_client.get_run(entry.parent_run_id)
    assert parent.info.status == "FAILED"
    assert parent.data.tags["stratoflow.kind"] == "strategy_benchmark"
    assert "stratoflow.recommended_strategy" not in parent.data.tags
    (child,) = children_of(mlflow_client, parent.info.run_id)
    assert child.info.status == "FAILED"
    assert "no TPU" in child.data.tags["stratoflow.error"]
    comparison = mlflow.artifacts.load_dict(f"runs:/{parent.info.run_id}/benchmark/comparison.json")
    assert comparison["recommendation"] is None
    assert [(r["strategy"], r["status"]) for r in comparison["strategies"]] == [("tpu", "failed")]


def test_a_training_task_that_died_is_reported_failed_and_its_run_closed(mlflow_client):
    run = AirflowRun(DAG_ID, "manual__killed")
    params = {"epochs": 1, "strategies": ["one_device"]}
    planned = strategy_benchmark.plan("digits", params, run)
    spec = strategy_benchmark.benchmark_spec("digits", params)
    # The strategy's plan: resolved once, by plan, and carried to its training task.
    assert planned[0].run_config == resolve_variant(spec, {"strategy": "one_device"})
    # What a killed task leaves behind: a child run that never left RUNNING.
    child_id = strategy_benchmark._fresh_child_run(
        spec, run, planned[0].parent_run_id, planned[0].dataset.to_dict()
    )

    with pytest.raises(RuntimeError, match="one_device: did not finish"):
        strategy_benchmark.compare("digits", run, planned)
    assert mlflow_client.get_run(child_id).info.status == "FAILED"


def test_a_rerun_strategy_replaces_its_child_run(mlflow_client):
    run = AirflowRun(DAG_ID, "manual__rerun")
    params = {"strategies": ["one_device"]}
    (entry,) = strategy_benchmark.plan("digits", params, run)
    spec = strategy_benchmark.benchmark_spec("digits", params)

    dataset = entry.dataset.to_dict()
    first = strategy_benchmark._fresh_child_run(spec, run, entry.parent_run_id, dataset)
    second = strategy_benchmark._fresh_child_run(spec, run, entry.parent_run_id, dataset)

    assert [c.info.run_id for c in children_of(mlflow_client, entry.parent_run_id)] == [second]
    assert mlflow_client.get_run(first).info.lifecycle_stage == "deleted"


def test_each_strategy_s_settings_are_checked_once_by_the_plan_task(mlflow_client):
    """The benchmark's own settings once, each strategy that will train once, in `plan`; the
    tasks after it take each strategy's plan from XCom as it is."""
    run = AirflowRun(DAG_ID, "manual__checks")
    with counting_calls(check_training) as checks:
        planned = strategy_benchmark.plan("digits", {"strategies": ["one_device", "tpu"]}, run)
        for entry in planned:  # as train_strategy and compare get them
            type(entry).from_dict(json.loads(json.dumps(entry.to_dict())))
    assert [e.strategy for e in planned] == ["one_device", "tpu"] and planned[1].unavailable
    assert checks[0] == 2, f"check_training ran {checks[0]} times (1 + 1 strategy to train)"


def test_without_a_plan_the_parent_is_marked_failed(mlflow_client):
    run = AirflowRun(DAG_ID, "manual__noplan")
    (entry,) = strategy_benchmark.plan("digits", {"strategies": ["one_device"]}, run)

    with pytest.raises(RuntimeError, match="first task \\(plan_strategies\\) did not succeed"):
        strategy_benchmark.compare("digits", run, None)
    assert mlflow_client.get_run(entry.parent_run_id).info.status == "FAILED"


def test_an_unknown_param_is_refused_before_any_run_exists(mlflow_client):
    with pytest.raises(SpecError, match="unknown key 'strategy'; allowed: epochs, seed"):
        strategy_benchmark.plan("digits", {"strategy": "mirrored"}, AirflowRun(DAG_ID, "manual__x"))
    assert strategy_benchmark.find_parent_run("digits", DAG_ID, "manual__x") is None


@pytest.mark.parametrize("tolerance", [float("nan"), float("inf"), -0.5, "0.1"])
def test_a_tolerance_that_is_not_a_finite_fraction_is_refused_naming_it(tolerance):
    with pytest.raises(SpecError, match=r"benchmark conf\.tolerance must be a finite number"):
        strategy_benchmark.benchmark_spec("digits", {"tolerance": tolerance})
