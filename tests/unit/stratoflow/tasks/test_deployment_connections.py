"""A task process applies the deployment's `stratoflow_mlflow` connection to its environment, read
through Airflow's own secrets backends (here the `AIRFLOW_CONN_*` variable one), and leaves its
environment alone where the deployment defines none."""

from __future__ import annotations

import json

import pytest

from stratoflow.config.connections import ConnectionConfigError
from stratoflow.tasks.deployment_connections import MlflowTrackingHook, apply_connections

CONNECTION_ENV = "AIRFLOW_CONN_STRATOFLOW_MLFLOW"


def test_the_connection_replaces_the_environments_uri_and_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        CONNECTION_ENV,
        json.dumps(
            {
                "conn_type": "stratoflow_mlflow",
                "host": "https://mlflow.example.org",
                "password": "team-token",
            }
        ),
    )
    environ = {
        "MLFLOW_TRACKING_URI": "sqlite:////tmp/elsewhere.db",
        "MLFLOW_TRACKING_USERNAME": "environment-account",
        "MLFLOW_TRACKING_PASSWORD": "environment-password",
    }
    assert apply_connections(environ) is True
    assert environ == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.org",
        "MLFLOW_TRACKING_TOKEN": "team-token",
    }
    assert MlflowTrackingHook().tracking_environment()["MLFLOW_TRACKING_TOKEN"] == "team-token"


def test_without_a_connection_the_environment_stays_as_the_deployment_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONNECTION_ENV, raising=False)
    environ = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_USERNAME": "svc"}
    assert apply_connections(environ) is False
    assert environ == {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "MLFLOW_TRACKING_USERNAME": "svc",
    }


def test_a_malformed_connection_fails_the_task_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONNECTION_ENV, json.dumps({"conn_type": "stratoflow_mlflow"}))
    environ = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
    with pytest.raises(ConnectionConfigError, match="'stratoflow_mlflow': host is empty"):
        apply_connections(environ)
    assert environ == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
