"""The typed results the task bodies hand each other through XCom: each survives `to_dict`, JSON
and `from_dict` unchanged, keeps the keys a REST client reads, and a payload that is not one fails
with an error naming the task it came from and the key at fault (no Airflow, no MLflow here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stratoflow.config.features import Features, Target
from stratoflow.config.run_plan import RunPlan, resolve_plan
from stratoflow.data.datasets import DatasetRef
from stratoflow.tasks.evaluate import Evaluation
from stratoflow.tasks.prepare import PreparedDataset
from stratoflow.tasks.refresh import PreparedVersion, RefreshedDataset
from stratoflow.tasks.register import Registration
from stratoflow.tasks.run_context import PayloadError
from stratoflow.tasks.strategy_benchmark import (
    BenchmarkOutcome,
    PlannedStrategy,
    StrategyResult,
    benchmark_spec,
)
from stratoflow.tasks.train import TrainedModel
from stratoflow.tasks.validate_data import DataGateResult
from stratoflow.training.evaluation import GateCheck, GateDecision

DATASET = DatasetRef(
    name="stratoflow_digits",
    version="1.0.0",
    config=None,
    data_dir="/data/tfds",
    splits={"train": "train", "validation": "validation", "test": "test"},
    split_sizes={"train": 1439, "validation": 179, "test": 179},
    features=Features("image", shape=(8, 8, 1)),
    target=Target("classification", class_names=tuple(str(k) for k in range(10))),
    fingerprint="ab" * 32,
    built=False,
)


def examples() -> list[Any]:
    """One of each result, with values a real run produces."""
    plan = resolve_plan("digits", {"strategy": "mirrored", "replicas": 2, "epochs": 3})
    return [
        PreparedDataset(dataset=DATASET, mlflow_run_id="r1", plan=plan),
        TrainedModel(
            mlflow_run_id="r1",
            model_path="/state/runs/retrain_digits/manual__x/model.keras",
            num_replicas=2,
            num_workers=1,
            epochs=3,
            resumed_from_epoch=1,
            final_epoch={"epoch": 3, "loss": 0.21, "val_accuracy": 0.93},
            test_outputs_path="/state/runs/retrain_digits/manual__x/test_outputs.npz",
        ),
        Evaluation(
            mlflow_run_id="r1",
            test_metrics={"test_loss": 0.2, "test_accuracy": 0.94},
            gate=GateDecision(
                passed=False,
                reasons=["slice class_3 (class 3, 18 examples): accuracy 0.5000 is more than ..."],
                champion_version="3",
                champion_value=0.96,
                checks=[
                    GateCheck(
                        kind="metric",
                        name="test_accuracy",
                        description="test_accuracy",
                        metric="test_accuracy",
                        value=0.94,
                        higher_is_better=True,
                        passed=True,
                        bound=0.9,
                        max_regression=0.02,
                        champion_value=0.96,
                    ),
                    GateCheck(
                        kind="slice",
                        name="class_3",
                        description="class 3",
                        metric="accuracy",
                        value=0.5,
                        higher_is_better=True,
                        passed=False,
                        max_regression=0.12,
                        champion_value=0.94,
                        examples=18,
                        reason="slice class_3 (class 3, 18 examples): accuracy 0.5000 is more ...",
                    ),
                ],
            ),
        ),
        Registration(
            registered_model="stratoflow-digits",
            version="4",
            model_uri="models:/m-123",
            aliases=["challenger"],
            promoted=False,
            mlflow_run_id="r1",
        ),
        RefreshedDataset(
            dataset="stratoflow_digits",
            versions={"1.0.0": PreparedVersion("ab" * 32, True, {"train": 1439, "test": 179})},
        ),
        PlannedStrategy(
            strategy="central_storage",
            label="central_storage (2 replicas)",
            overrides={"strategy": "central_storage", "replicas": 2},
            unavailable="model 'mlp' has Dropout",
            parent_run_id="p1",
            dataset=DATASET,
            run_config=RunPlan.of(benchmark_spec("digits", {"epochs": 2})),
            tolerance=0.05,
        ),
        StrategyResult(strategy="mirrored", mlflow_run_id="c1", test_accuracy=0.9),
        BenchmarkOutcome(
            parent_run_id="p1",
            recommended_strategy="one_device",
            succeeded=["one_device"],
            failed=[],
        ),
        DataGateResult(
            passed=True,
            accepted_drift=True,
            champion="3",
            anomalies=["drift: bill_depth_mm: population stability index 3.322 ..."],
        ),
    ]


@pytest.mark.parametrize("result", examples(), ids=lambda result: type(result).__name__)
def test_a_result_survives_xcom_unchanged(result: Any) -> None:
    payload = json.loads(json.dumps(result.to_dict()))  # what XCom stores: JSON types only
    assert payload == result.to_dict()
    assert type(result).from_dict(payload) == result


def test_the_xcom_keys_a_rest_client_reads_are_kept() -> None:
    prepared, trained, evaluated, registered = (r.to_dict() for r in examples()[:4])
    # The dataset reference's keys stay at the top of prepare_dataset's XCom.
    assert set(prepared) == {*DATASET.to_dict(), "mlflow_run_id", "run_config"}
    assert prepared["run_config"]["training"]["strategy"] == "mirrored"
    assert set(trained) == {
        "mlflow_run_id",
        "model_path",
        "num_replicas",
        "num_workers",
        "epochs",
        "resumed_from_epoch",
        "final_epoch",
        "test_outputs_path",
    }
    assert set(evaluated) == {"mlflow_run_id", "test_metrics", "gate"}
    assert set(evaluated["gate"]) == {
        "passed",
        "reasons",
        "champion_version",
        "champion_value",
        "checks",
    }
    assert set(evaluated["gate"]["checks"][1]) == {
        "kind",
        "name",
        "description",
        "metric",
        "value",
        "higher_is_better",
        "passed",
        "bound",
        "max_regression",
        "champion_value",
        "examples",
        "gated",
        "reason",
    }
    assert set(registered) == {
        "registered_model",
        "version",
        "model_uri",
        "aliases",
        "promoted",
        "mlflow_run_id",
        "serving_check",
    }
    # The benchmark's mapped task instances are named by `entry['strategy']`.
    assert examples()[5].to_dict()["strategy"] == "central_storage"


def test_the_carried_plan_is_the_resolved_one() -> None:
    prepared = examples()[0]
    carried = PreparedDataset.from_dict(json.loads(json.dumps(prepared.to_dict()))).plan
    assert carried == resolve_plan("digits", {"strategy": "mirrored", "replicas": 2, "epochs": 3})
    assert (carried.training.strategy, carried.training.replicas) == ("mirrored", 2)


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


def changed(data: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {**data, **values}


def bad_payloads() -> list[Any]:
    prepared, trained, evaluated, registered = (r.to_dict() for r in examples()[:4])
    planned = examples()[5].to_dict()
    config = prepared["run_config"]
    bad_config = {**config, "training": {**config["training"], "strategy": "bogus"}}
    more_members = {
        **config,
        "training": {**config["training"], "strategy": "multi_worker_mirrored", "replicas": 1},
    }
    no_cluster = without(config, "cluster")
    return [
        (PreparedDataset, without(prepared, "mlflow_run_id"), r"prepare_dataset.*'mlflow_run_id'"),
        (PreparedDataset, without(prepared, "run_config"), r"prepare_dataset.*'run_config'"),
        (PreparedDataset, without(prepared, "fingerprint"), r"prepare_dataset.*fingerprint"),
        (
            PreparedDataset,
            changed(prepared, run_config=bad_config),
            r"run_config: training.strategy 'bogus' is not allowed; allowed: .*one_device",
        ),
        (
            PreparedDataset,
            changed(prepared, run_config=more_members),
            r"run_config: cluster is not the members its training settings plan",
        ),
        (
            PreparedDataset,
            changed(prepared, run_config=no_cluster),
            r"run_config: missing required key 'cluster'",
        ),
        (PreparedDataset, [prepared], r"prepare_dataset: expected a dict, got list"),
        (TrainedModel, without(trained, "model_path"), r"train_model .*missing key 'model_path'"),
        (TrainedModel, changed(trained, epochs="3"), r"train_model: epochs must be int, got str"),
        (TrainedModel, changed(trained, extra=1), r"train_model .*unknown key 'extra'"),
        (TrainedModel, None, r"train_model: expected a TrainedModel as a dict, got NoneType"),
        (
            Evaluation,
            changed(evaluated, gate={**evaluated["gate"], "passed": "yes"}),
            r"evaluate_model: gate.passed must be bool, got str",
        ),
        (Evaluation, changed(evaluated, gate={}), r"evaluate_model: gate .*missing key 'passed'"),
        (
            Registration,
            changed(registered, aliases="champion"),
            r"log_and_register: aliases must be list",
        ),
        (
            PlannedStrategy,
            without(planned, "parent_run_id"),
            r"plan_strategies .*missing key 'parent_run_id'",
        ),
        (
            RefreshedDataset,
            {"dataset": "d", "versions": {"1.0.0": {"fingerprint": "f", "built": True}}},
            r"refresh: versions.1.0.0 .*missing key 'split_sizes'",
        ),
    ]


@pytest.mark.parametrize(
    ("cls", "payload", "message"),
    bad_payloads(),
    ids=[f"{cls.__name__}-{n}" for n, (cls, *_) in enumerate(bad_payloads())],
)
def test_a_bad_payload_is_refused_naming_its_task_and_key(
    cls: Any, payload: Any, message: str
) -> None:
    with pytest.raises(PayloadError, match=message):
        cls.from_dict(payload)
