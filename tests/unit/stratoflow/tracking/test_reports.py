"""Links to the MLflow UI printed by `stratoflow compare` (no server needed)."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from stratoflow.config import locations
from stratoflow.tracking import reports


def test_a_local_store_links_to_where_mlflow_ui_serves(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(locations.TRACKING_URI_ENV, "sqlite:////tmp/x/mlflow.db")
    url = reports.compare_url(["abc", "def"], ["3", "3"])
    assert url == 'http://127.0.0.1:5000/#/compare-runs?runs=["abc","def"]&experiments=["3"]'
    assert "--port 5000" in reports.ui_command()


def test_a_tracking_server_links_to_its_own_ui(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(locations.TRACKING_URI_ENV, "https://mlflow.example.com/")
    url = reports.compare_url(["abc"], ["1", "2"])
    base, fragment = url.split("#")
    assert base == "https://mlflow.example.com/"
    route, query = fragment.split("?")
    assert route == "/compare-runs"
    fields = dict(urllib.parse.parse_qsl(query))
    assert json.loads(fields["runs"]) == ["abc"]
    assert json.loads(fields["experiments"]) == ["1", "2"]


def test_compare_lists_the_retrain_runs_and_a_benchmark_run_only_when_picked(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    from stratoflow.tracking import mlflow_runs

    monkeypatch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow_client = mlflow_runs.client()
    experiment_id = mlflow_runs.ensure_experiment(mlflow_client, "digits")
    run_ids = {
        dag_id: mlflow_client.create_run(
            experiment_id, tags={"airflow.dag_id": dag_id, "strategy": "one_device"}
        ).info.run_id
        for dag_id in ("retrain_digits", "benchmark_strategies_digits")
    }
    listed = [row["run_id"] for row in reports.compare_runs("digits")]
    assert listed == [run_ids["retrain_digits"]]
    picked = reports.compare_runs("digits", run_ids=[run_ids["benchmark_strategies_digits"]])
    assert [row["run_id"] for row in picked] == [run_ids["benchmark_strategies_digits"]]
