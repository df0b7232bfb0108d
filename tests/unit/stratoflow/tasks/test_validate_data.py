"""The data gate task on real penguins statistics and a real MLflow store (no Airflow, no
training): a first run passes saying it had nothing to compare with; once its run's version is
champion, shifted data is refused with the report in MLflow; `accept_drift` lets it through;
a champion trained before statistics were kept is named and leaves only the declared checks."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Any

import pytest

from stratoflow.config import locations, names
from stratoflow.config.run_plan import resolve_plan
from stratoflow.data.statistics import STATISTICS_FILE
from stratoflow.tasks import validate_data
from stratoflow.tasks.prepare import PreparedDataset, write_statistics
from stratoflow.tasks.run_context import AirflowRun
from stratoflow.training.data_gate import DataGateError
from tests.conftest import fresh_mlflow_client

MODEL = "stratoflow-penguins"


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-validate-data")


@pytest.fixture(scope="module")
def penguins(tf_runtime) -> tuple[Any, Any, Any]:
    """The prepared penguins, their statistics, and those of a copy with bill_depth_mm + 3."""
    from stratoflow.config.spec import load_spec
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.data.profiling import dataset_statistics
    from stratoflow.data.statistics import DatasetStatistics

    spec = load_spec("penguins")
    reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    statistics = dataset_statistics(reference)
    shifted = statistics.to_dict()
    for split in shifted["splits"].values():
        for feature in split["features"]:
            if feature["name"] == "bill_depth_mm":
                feature["quantiles"] = [q + 3.0 for q in feature["quantiles"]]
                feature["mean"] += 3.0
    return reference, statistics, DatasetStatistics.from_dict(shifted)


def prepared_run(mlflow_client, reference, statistics, conf: dict[str, Any]) -> Any:
    """A DAG run after `prepare_dataset`: its statistics in its folder, its MLflow run open."""
    from stratoflow.tracking import mlflow_runs

    run = AirflowRun("retrain_penguins", f"manual__{uuid.uuid4().hex[:12]}")
    write_statistics(statistics, locations.run_dir(run.dag_id, run.run_id))
    plan = resolve_plan("penguins", conf)
    experiment = mlflow_runs.ensure_experiment(mlflow_client, "penguins")
    mlflow_run = mlflow_client.create_run(experiment)
    return run, PreparedDataset(reference, mlflow_run.info.run_id, plan)


def make_champion(mlflow_client, run_id: str) -> str:
    from mlflow.exceptions import MlflowException

    with contextlib.suppress(MlflowException):  # made by an earlier test
        mlflow_client.create_registered_model(MODEL)
    version = mlflow_client.create_model_version(MODEL, f"runs:/{run_id}/model", run_id=run_id)
    mlflow_client.set_registered_model_alias(MODEL, names.CHAMPION, version.version)
    return str(version.version)


def artifact(mlflow_client, run_id: str, path: str, tmp_path) -> dict:
    return json.loads(open(mlflow_client.download_artifacts(run_id, path, str(tmp_path))).read())


def test_the_gate_compares_with_the_champions_statistics(
    mlflow_client, penguins, tmp_path, caplog
) -> None:
    reference, statistics, shifted = penguins
    caplog.set_level(logging.INFO, logger="stratoflow.tasks.validate_data")

    run, prepared = prepared_run(mlflow_client, reference, statistics, {})
    first = validate_data.validate_data(run, prepared)
    assert first.passed and first.champion == "" and first.anomalies == []
    assert "no champion statistics to compare with" in caplog.text
    first_run = mlflow_client.get_run(prepared.mlflow_run_id)
    assert first_run.data.tags[names.DATA_GATE_PASSED_TAG] == "True"
    assert names.STATISTICS_SECONDS_METRIC in first_run.data.metrics
    logged = artifact(mlflow_client, prepared.mlflow_run_id, names.STATISTICS_ARTIFACT, tmp_path)
    assert logged == statistics.to_dict()
    version = make_champion(mlflow_client, prepared.mlflow_run_id)

    run, prepared = prepared_run(mlflow_client, reference, shifted, {})
    with pytest.raises(DataGateError, match="drift: bill_depth_mm: population stability index"):
        validate_data.validate_data(run, prepared)
    assert "data gate anomaly: drift: bill_depth_mm" in caplog.text
    refused = mlflow_client.get_run(prepared.mlflow_run_id)
    assert refused.data.tags[names.DATA_GATE_PASSED_TAG] == "False"
    assert refused.data.tags[names.DATA_GATE_CHAMPION_TAG] == version
    report = artifact(mlflow_client, prepared.mlflow_run_id, names.DATA_GATE_ARTIFACT, tmp_path)
    assert [a["feature"] for a in report["anomalies"]] == ["bill_depth_mm"]
    assert "bill_depth_mm" in artifact_text(mlflow_client, prepared.mlflow_run_id, tmp_path)

    run, prepared = prepared_run(mlflow_client, reference, shifted, {"accept_drift": True})
    accepted = validate_data.validate_data(run, prepared)
    assert accepted.passed and accepted.accepted_drift and accepted.champion == version
    tags = mlflow_client.get_run(prepared.mlflow_run_id).data.tags
    assert tags[names.DATA_GATE_ACCEPTED_TAG] == "True"


def artifact_text(mlflow_client, run_id: str, tmp_path) -> str:
    path = mlflow_client.download_artifacts(run_id, names.DATA_GATE_HTML_ARTIFACT, str(tmp_path))
    return open(path).read()


def test_a_champion_without_statistics_leaves_the_declared_checks_only(
    mlflow_client, penguins, caplog
) -> None:
    reference, statistics, shifted = penguins
    old = mlflow_client.create_run(
        mlflow_client.get_experiment_by_name("stratoflow/penguins").experiment_id
    )
    version = make_champion(mlflow_client, old.info.run_id)

    assert validate_data.champion_statistics(MODEL) == (version, None)
    assert f"champion version {version} (run {old.info.run_id}) has no data/statistics.json" in (
        caplog.text
    )
    run, prepared = prepared_run(mlflow_client, reference, shifted, {})
    assert validate_data.validate_data(run, prepared).passed
    assert (locations.run_dir(run.dag_id, run.run_id) / STATISTICS_FILE).is_file()
