"""The data gate through real DAG runs (`stratoflow run`, `airflow dags test`): a copy of the
penguins pipeline trains a champion; the same pipeline with one feature shifted by a constant is
stopped in `validate_data` before any training, without a retry, with the anomaly named in the
CLI's last lines and the report in MLflow, nothing registered; and `--accept-drift` lets the same
data train for one run, recorded on its MLflow run."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stratoflow.config import names
from stratoflow.services import airflow_setup
from tests.conftest import fresh_mlflow_client

pytestmark = pytest.mark.integration

PIPELINE = "gated"
SHIFT = '''def shift(features, label):
    """bill_depth_mm 3 mm deeper: a unit or calibration change upstream."""
    return {**features, "bill_depth_mm": features["bill_depth_mm"] + 3.0}, label
'''


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-data-gate")


@pytest.fixture(scope="module")
def pipelines_path(tmp_path_factory) -> Path:
    """A copy of penguins whose gate takes any accuracy: every run that trains registers."""
    from stratoflow.config import scaffold

    root = tmp_path_factory.mktemp("data-gate-pipelines")
    folder = scaffold.new_pipeline(PIPELINE, "penguins", root)
    spec = folder / "pipeline.yaml"
    spec.write_text(spec.read_text().replace("min: 0.9", "min: 0.0"))
    return root


def stratoflow_run(pipelines_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stratoflow.cli.main", "run", PIPELINE, "--epochs", "2", *flags],
        env={**os.environ, "STRATOFLOW_PIPELINES_PATH": str(pipelines_path)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        check=False,
    )


def runs(mlflow_client) -> list:
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(PIPELINE))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time ASC"]
    )


def tries(run_id: str) -> dict[str, int]:
    home = airflow_setup.airflow_home()
    with sqlite3.connect(home / "airflow.db") as connection:
        return dict(
            connection.execute(
                "SELECT task_id, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? "
                "AND try_number > 0",
                (names.retrain_dag_id(PIPELINE), run_id),
            ).fetchall()
        )


def artifact(mlflow_client, run_id: str, path: str, folder: Path) -> dict:
    return json.loads(Path(mlflow_client.download_artifacts(run_id, path, str(folder))).read_text())


def test_a_shifted_feature_stops_the_run_before_training_until_accepted(
    mlflow_client, pipelines_path: Path, tmp_path: Path
) -> None:
    from stratoflow.tracking import model_registry

    first = stratoflow_run(pipelines_path)
    assert first.returncode == 0, first.stdout[-3000:]
    (champion,) = runs(mlflow_client)
    assert champion.data.tags[names.DATA_GATE_PASSED_TAG] == "True"
    assert champion.data.tags[names.DATA_GATE_CHAMPION_TAG] == "none"
    assert "no champion statistics to compare with" in first.stdout
    statistics = artifact(mlflow_client, champion.info.run_id, names.STATISTICS_ARTIFACT, tmp_path)
    assert set(statistics["splits"]) == {"train", "validation", "test"}

    folder = pipelines_path / PIPELINE
    (folder / "shift.py").write_text(SHIFT)
    spec = folder / "pipeline.yaml"
    spec.write_text(
        spec.read_text().replace(
            '"penguins_dataset:StratoflowPenguins"',
            '"penguins_dataset:StratoflowPenguins"\n  preprocess: "shift:shift"',
        )
    )
    refused = stratoflow_run(pipelines_path)

    assert refused.returncode == 1, refused.stdout[-3000:]
    last = "\n".join(refused.stdout.strip().splitlines()[-5:])
    assert "validate_data failed: DataGateError: data gate failed" in last, last
    assert "bill_depth_mm: population stability index" in last, last
    assert "data gate anomaly: drift: bill_depth_mm" in refused.stdout  # the task log's line
    gated = runs(mlflow_client)[1]
    assert gated.info.status == "FAILED"
    assert tries(gated.data.tags[names.RUN_ID_TAG]) == {"prepare_dataset": 1, "validate_data": 1}
    assert "loss" not in gated.data.metrics  # nothing trained
    report = artifact(mlflow_client, gated.info.run_id, names.DATA_GATE_ARTIFACT, tmp_path)
    assert report["passed"] is False and report["champion"] == "1"
    assert [a["feature"] for a in report["anomalies"]] == ["bill_depth_mm"]
    assert model_registry.alias_targets(mlflow_client, PIPELINE) == {
        "champion": "1",
        "challenger": "1",
    }

    accepted = stratoflow_run(pipelines_path, "--accept-drift")

    assert accepted.returncode == 0, accepted.stdout[-3000:]
    trained = runs(mlflow_client)[2]
    assert trained.data.tags[names.DATA_GATE_ACCEPTED_TAG] == "True"
    assert trained.data.params["training.accept_drift"] == "True"
    assert "loss" in trained.data.metrics
    assert model_registry.alias_targets(mlflow_client, PIPELINE)["challenger"] == "2"
