"""The summary a run's last task keeps for `stratoflow run` (`stratoflow.tracking.run_summary`):
what MLflow says of the run, on a real SQLite store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stratoflow.config import locations, names
from stratoflow.tracking import reports, run_summary

DAG_ID = "retrain_digits"
RUN_ID = "manual__2026-12-07T01:54:17.540811+00:00"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(locations.STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


def test_the_kept_summary_is_what_mlflow_says_of_the_run(store: Path) -> None:
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client()
    experiment_id = mlflow_runs.ensure_experiment(mlflow_client, "digits")
    run = mlflow_client.create_run(
        experiment_id,
        tags={names.DAG_ID_TAG: DAG_ID, names.RUN_ID_TAG: RUN_ID, "gate.reasons": "passed"},
    )
    mlflow_client.log_metric(run.info.run_id, "test_accuracy", 0.91)
    mlflow_client.log_metric(run.info.run_id, "examples_per_second", 1000.0)  # not summarised
    model = mlflow_runs.registered_model_name("digits")
    mlflow_client.create_registered_model(model)
    version = mlflow_client.create_model_version(
        model, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
    )
    mlflow_client.set_registered_model_alias(model, names.CHAMPION, version.version)
    mlflow_client.set_tag(run.info.run_id, names.VERSION_TAG, version.version)

    run_summary.record("digits", DAG_ID, RUN_ID)

    kept = run_summary.recorded(DAG_ID, RUN_ID)
    assert kept == reports.describe_dag_run("digits", DAG_ID, RUN_ID)
    assert kept is not None and kept["aliases"] == [names.CHAMPION]
    assert kept["test_metrics"] == {"test_accuracy": 0.91}
    path = run_summary.summary_path(DAG_ID, RUN_ID)
    assert path.parent == locations.run_dir(DAG_ID, RUN_ID)
    assert [p.name for p in path.parent.iterdir()] == [run_summary.SUMMARY_FILE]  # no temp file


def test_a_summary_that_cannot_be_kept_is_logged_and_the_run_goes_on(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No MLflow run of that DAG run: the task logs it and does not fail; the CLI asks MLflow."""
    with caplog.at_level(logging.WARNING):
        run_summary.record("digits", DAG_ID, RUN_ID)
    assert f"Could not keep the summary of DAG run {RUN_ID} (LookupError" in caplog.text
    assert run_summary.recorded(DAG_ID, RUN_ID) is None


def test_a_missing_or_damaged_summary_reads_as_none(store: Path) -> None:
    path = run_summary.summary_path(DAG_ID, RUN_ID)
    assert run_summary.recorded(DAG_ID, RUN_ID) is None
    path.parent.mkdir(parents=True)
    path.write_text('{"mlflow_run_id": "ab')  # cut short
    assert run_summary.recorded(DAG_ID, RUN_ID) is None
    path.write_text("[1, 2]")
    assert run_summary.recorded(DAG_ID, RUN_ID) is None
