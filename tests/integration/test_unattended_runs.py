"""Runs nobody watches, through real `airflow dags test` runs of the digits pipeline into a fresh
MLflow store, with mail going to an SMTP sink on loopback:

- a scheduled run with nothing new since the champion skips every task, with the reason;
- a scheduled run with `force`, and a manual run, train;
- the promotion and a refused run each send a mail naming the DAG, the run and the reason (the
  mail of a failed evaluation gate: tests/integration/test_retrain_dag.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from stratoflow.config import names
from tests.conftest import fresh_mlflow_client
from tests.support.dag_runs import DagTest, dags_test
from tests.support.smtp_sink import SmtpSink, deployment_mail_sink

pytestmark = pytest.mark.integration

DAG_ID = "retrain_digits"
MODEL = "stratoflow-digits"
RECIPIENT = "ml-platform@example.org"
TRAINING_TASKS = (
    names.VALIDATE_DATA_TASK,
    names.TRAIN_TASK,
    names.EVALUATE_TASK,
    names.REGISTER_TASK,
)


@pytest.fixture(scope="module")
def sink() -> Iterator[SmtpSink]:
    with deployment_mail_sink(RECIPIENT) as running:
        yield running


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory, sink):
    yield from fresh_mlflow_client(tmp_path_factory, "mlflow-unattended")


@pytest.fixture(scope="module")
def champion_run(mlflow_client) -> DagTest:
    """A manual run on an empty store: it trains and its version becomes the champion."""
    result = dags_test(DAG_ID, {}, f"manual__champion_{time.time_ns()}")
    assert result.state == "success", result.output[-3000:]
    return result


def run_of(mlflow_client, run_id: str) -> Any | None:
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name("digits"))
    runs = mlflow_client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{names.RUN_ID_TAG}` = '{run_id}'"
    )
    return runs[0] if runs else None


def champion_version(mlflow_client) -> str:
    return str(mlflow_client.get_model_version_by_alias(MODEL, names.CHAMPION).version)


def mails_about(sink: SmtpSink, run_id: str) -> list[str]:
    return [sink.text_of(mail) for mail in sink.mails if run_id in str(mail["Subject"])]


def test_the_champion_run_records_its_fingerprints_and_mails_its_promotion(
    champion_run, mlflow_client, sink
):
    run = run_of(mlflow_client, champion_run.run_id)
    for part in ("dataset", "code", "config"):
        assert len(run.data.tags[f"stratoflow.fingerprint.{part}"]) == 64, part
    assert champion_version(mlflow_client) == "1"
    (mail,) = mails_about(sink, champion_run.run_id)
    assert f"{DAG_ID}: run {champion_run.run_id} promoted {MODEL} version 1 to champion" in mail
    assert RECIPIENT in sink.recipients[0]


def test_an_unchanged_scheduled_run_skips_training_and_says_why(champion_run, mlflow_client, sink):
    run_id = f"scheduled__unchanged_{time.time_ns()}"
    result = dags_test(DAG_ID, {}, run_id, run_type="scheduled")

    assert result.state == "success", result.output[-3000:]
    assert result.task_states == dict.fromkeys((names.PREPARE_TASK, *TRAINING_TASKS), "skipped"), (
        result.output[-3000:]
    )
    reason = result.xcom(DAG_ID, names.PREPARE_TASK, "skipped_because")
    assert reason.startswith(f"nothing new since the champion, {MODEL} version 1")
    assert reason in result.output  # the task log
    assert run_of(mlflow_client, run_id) is None  # no MLflow run: nothing was trained
    assert champion_version(mlflow_client) == "1"
    assert mails_about(sink, run_id) == []  # nothing happened that anyone must hear about


def fingerprint_tags(run: Any) -> dict[str, str]:
    return {key: value for key, value in run.data.tags.items() if "fingerprint" in key}


@pytest.mark.parametrize(
    ("run_type", "conf", "why"),
    [("scheduled", {"force": True}, "forced"), ("manual", {}, "a manual run")],
    ids=["scheduled_with_force", "manual"],
)
def test_a_forced_or_manual_run_with_nothing_new_trains(
    champion_run, mlflow_client, run_type: str, conf: dict[str, Any], why: str
):
    """The decision is `prepare_dataset`'s: it goes on and opens the run's MLflow run. The
    training tasks after it are the ones every run has; Airflow marks them successful here
    instead of running them, to keep the test cheap (the champion's run trained for real)."""
    run_id = f"{run_type}__nothing_new_{time.time_ns()}"
    result = dags_test(DAG_ID, conf, run_id, run_type, mark_success="|".join(TRAINING_TASKS))

    assert result.state == "success", result.output[-3000:]
    assert result.task_states[names.PREPARE_TASK] == "success", result.output[-3000:]
    assert result.xcom(DAG_ID, names.PREPARE_TASK, "skipped_because") is None
    assert f"nothing new since the champion, {MODEL} version 1" in result.output
    assert f"training anyway: {why}" in result.output
    run, champion = run_of(mlflow_client, run_id), run_of(mlflow_client, champion_run.run_id)
    # Same data, code and model configuration: `force` is not part of the fingerprint.
    assert fingerprint_tags(run) == fingerprint_tags(champion)


def test_a_refused_run_mails_the_reason(sink):
    run_id = f"manual__refused_{time.time_ns()}"
    conf = {"strategy": "mirrored", "replicas": 2, "batch_size": 33}
    result = dags_test(DAG_ID, conf, run_id)

    assert result.state == "failed"
    (mail,) = mails_about(sink, run_id)
    assert f"{DAG_ID}: run {run_id} refused in {names.PREPARE_TASK}" in mail
    assert "run conf.batch_size 33 must be divisible by replicas 2" in mail
