"""A retrain run finds the MLflow server through the Airflow Connection `stratoflow_mlflow` alone.

The run is `airflow dags test` of `retrain_penguins` in a local Airflow with no MLflow credentials
in its environment and a tracking URI that leads elsewhere; the connection names the services
stack's MLflow server (basic authentication on) and its service account. The run must land on
that server, and the account's password must not reach the task log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stratoflow.config import connections, locations, names
from stratoflow.services.config import MLFLOW_SERVICE_USER
from tests.integration.services.stack import LiveStack
from tests.support.dag_runs import dags_test

pytestmark = pytest.mark.integration


def test_a_retrain_run_logs_to_the_mlflow_server_its_airflow_connection_names(
    live: LiveStack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = live.stack.config
    assert config is not None
    # The run's environment only: the test's own MLflow client keeps the admin account.
    with monkeypatch.context() as run_env:
        for name in connections.CREDENTIAL_ENV:
            run_env.delenv(name, raising=False)
        elsewhere = tmp_path / "not-the-server.db"
        run_env.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{elsewhere}")
        run_env.setenv(
            "AIRFLOW_CONN_STRATOFLOW_MLFLOW",
            json.dumps(
                {
                    "conn_type": connections.MLFLOW_CONNECTION_TYPE,
                    "host": config.mlflow_uri,
                    "login": MLFLOW_SERVICE_USER,
                    "password": config.mlflow_service_password,
                }
            ),
        )
        run_id = "through-the-connection"
        result = dags_test(names.retrain_dag_id("penguins"), {"epochs": 1}, run_id)
        assert result.state == "success", result.output[-4000:]

    mlflow = live.mlflow()
    experiment = mlflow.get_experiment_by_name(names.experiment_name("penguins"))
    runs = mlflow.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{names.RUN_ID_TAG}` = '{run_id}'"
    )
    assert [run.info.status for run in runs] == ["FINISHED"]
    assert "test_accuracy" in runs[0].data.metrics
    assert not elsewhere.exists(), "the environment's tracking URI was used after all"
    assert config.mlflow_service_password not in result.output
    assert f"from the Airflow connection 'stratoflow_mlflow': {config.mlflow_uri}" in result.output
