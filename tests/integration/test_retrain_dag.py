"""Whole DAG runs through Airflow (`airflow dags test`, as `make run` does) into a fresh MLflow
store: the default mnist run (and every MLflow name the docs list on it), a worse run that must
not take the champion alias, a passing run with `promote: false`, failing runs (before and after
registering) that must leave nothing behind, and `stratoflow compare` over what they produced."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratoflow.cli import main, runner
from stratoflow.config import locations, names
from tests.conftest import fresh_mlflow_client
from tests.support import import_records
from tests.support.dag_runs import dags_test
from tests.support.file_modes import exposed_paths
from tests.support.smtp_sink import deployment_mail_sink

MLFLOW_NAMES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "mlflow-names.md"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fresh_tracking_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield


@pytest.fixture(scope="module")
def mlflow_client(fresh_tracking_store):
    from stratoflow.tracking import mlflow_runs

    return mlflow_runs.client()


def runs_of(mlflow_client, pipeline: str):

    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time ASC"]
    )


def metric_steps(mlflow_client, run_id: str, key: str) -> list[int]:
    return sorted(metric.step for metric in mlflow_client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def import_records_folder(tmp_path_factory) -> Path:
    """Where each process of the default mnist run records what it imported."""
    return tmp_path_factory.mktemp("imports")


@pytest.fixture(scope="module")
def default_mnist_run(mlflow_client, capsys_module, import_records_folder):
    with import_records.recording(import_records_folder):
        code = runner.run_pipeline("mnist", {})
    return code, capsys_module()


@pytest.fixture(scope="module")
def capsys_module():
    """What the runner printed (it writes its summary to stdout), captured per module."""
    import io

    buffer = io.StringIO()
    original = sys.stdout
    sys.stdout = buffer
    yield buffer.getvalue
    sys.stdout = original


def test_default_mnist_run_trains_evaluates_and_registers_a_champion(
    default_mnist_run, mlflow_client
):
    import mlflow

    from stratoflow.tracking import model_registry

    code, printed = default_mnist_run
    assert code == 0
    (run,) = runs_of(mlflow_client, "mnist")
    assert run.info.status == "FINISHED"
    assert run.data.tags["airflow.dag_id"] == "retrain_mnist"
    assert run.data.tags["airflow.run_id"].startswith("manual__")
    # Who made it: a local store's runs are the OS user's; `airflow dags test` (`stratoflow run`)
    # is the triggering user Airflow records.
    assert run.info.user_id == getpass.getuser()
    assert run.data.tags["airflow.triggered_by"] == "dag_test"
    assert run.data.tags["strategy"] == "one_device"
    assert run.data.tags["loop"] == "custom"
    assert run.data.tags["num_replicas"] == "1"
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second"):
        assert metric_steps(mlflow_client, run.info.run_id, key) == list(range(1, 9)), key
    assert run.data.metrics["test_accuracy"] >= 0.95
    assert run.data.params["training.epochs"] == "8"
    assert model_registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "1",
    }
    # The version names the statistics of the data it was trained on.
    statistics_uri = mlflow_client.get_model_version("stratoflow-mnist", "1").tags[
        names.STATISTICS_VERSION_TAG
    ]
    statistics = mlflow.artifacts.load_dict(statistics_uri)
    assert statistics["splits"]["train"]["examples"] == 4000, statistics["splits"]["train"].keys()
    assert "DAG run manual__" in printed and "succeeded" in printed
    assert "version 1 (aliases: challenger, champion)" in printed
    assert "mlflow ui --backend-store-uri" in printed


def test_no_airflow_task_process_imports_tensorflow(default_mnist_run, import_records_folder):
    """The tasks after training score, log and serve-check the model from what the training
    process recorded: the process that runs the Airflow tasks (and holds Airflow's and MLflow's
    secrets) imports neither TensorFlow nor Keras."""
    code, _ = default_mnist_run
    assert code == 0
    by_process = {
        " ".join(record["argv"][:3]): record["imported"]
        for record in import_records.records(import_records_folder)
    }
    (tasks,) = [argv for argv in by_process if argv.endswith("dags test")]
    # MLflow, which the tasks do import, shows that the record sees what the process imported.
    assert by_process[tasks] == ["mlflow"], by_process


def test_what_the_run_wrote_is_its_owners_only(default_mnist_run, mlflow_client):
    """`make run`'s run folder (trained model, history) and the run's MLflow artifacts, written
    by `airflow dags test` and the processes it starts, let no other user read, write or list
    them."""
    from mlflow.utils.file_utils import local_file_uri_to_path

    (run, *_) = runs_of(mlflow_client, "mnist")
    run_folder = locations.run_dir("retrain_mnist", run.data.tags["airflow.run_id"])
    artifacts = Path(local_file_uri_to_path(run.info.artifact_uri)).parent
    assert list(run_folder.iterdir()), f"nothing in the run folder {run_folder}"
    assert list(artifacts.rglob("*.png")), f"no figure under {artifacts}"
    offenders = exposed_paths(run_folder) + exposed_paths(artifacts)
    assert offenders == [], f"{len(offenders)} open to others:\n" + "\n".join(offenders[:40])


def test_a_worse_run_gets_challenger_but_leaves_champion(default_mnist_run, mlflow_client):
    from stratoflow.tracking import model_registry

    assert default_mnist_run[0] == 0
    conf = {"strategy": "mirrored", "replicas": 2, "epochs": 1, "learning_rate": 1e-5}
    with deployment_mail_sink("ml-platform@example.org") as sink:
        assert runner.run_pipeline("mnist", conf) == 0
    latest = runs_of(mlflow_client, "mnist")[-1]
    assert latest.data.tags["strategy"] == "mirrored"
    assert latest.data.tags["num_replicas"] == "2"
    assert latest.data.tags["gate.passed"] == "False"
    assert metric_steps(mlflow_client, latest.info.run_id, "loss") == [1]
    assert model_registry.alias_targets(mlflow_client, "stratoflow-mnist") == {
        "champion": "1",
        "challenger": "2",
    }
    # Someone hears about it: one mail naming the DAG, the run and the gate's reason.
    (mail,) = [sink.text_of(message) for message in sink.mails]
    run_id = latest.data.tags["airflow.run_id"]
    assert f"retrain_mnist: run {run_id} evaluation gate failed" in mail
    assert "stratoflow-mnist version 2 stays challenger" in mail
    assert "test_accuracy" in mail


def test_compare_lists_both_runs_and_marks_the_champion(default_mnist_run, mlflow_client, capsys):
    assert main.main(["compare", "mnist", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["strategy"] for row in rows] == ["mirrored", "one_device"]  # newest first
    assert [row["champion"] for row in rows] == [False, True]
    assert rows[1]["test_accuracy"] >= 0.95
    assert all(row["examples_per_second"] > 0 and row["duration_s"] > 0 for row in rows)
    assert main.main(["compare", "mnist"]) == 0
    table = capsys.readouterr().out
    assert "mirrored" in table and main.CHAMPION_MARKER in table


def test_a_run_that_fails_for_good_leaves_nothing_behind(mlflow_client):
    """No TPU here: both tries of train_model fail, and the failure callback cleans up."""
    assert runner.run_pipeline("digits", {"strategy": "tpu"}) == 1
    (run,) = [r for r in runs_of(mlflow_client, "digits") if r.data.tags["strategy"] == "tpu"]
    assert run.info.status == "FAILED"
    assert run.data.tags["airflow.try_number"] == "2"  # the retry reused the DAG run's MLflow run
    assert [
        v.run_id for v in mlflow_client.search_model_versions("name = 'stratoflow-digits'")
    ] == [
        r.info.run_id
        for r in runs_of(mlflow_client, "digits")
        if r.data.tags["strategy"] != "tpu"  # the promote: false run's, if it ran first
    ]
    dag_run_dir = locations.run_dir("retrain_digits", run.data.tags["airflow.run_id"])
    assert not dag_run_dir.exists()


def test_a_passing_run_with_promote_false_gets_challenger_but_not_champion(
    mlflow_client, capsys, monkeypatch
):
    """Also what a run costs: after runs that ended cleanly, a successful run asks Airflow's
    metadata DB nothing (each question is a process importing Airflow, 2-3 s of CPU), and
    prints the summary its last task kept, the same as MLflow gives it after the run."""
    from stratoflow.services import airflow_runs, airflow_setup
    from stratoflow.tracking import model_registry, reports

    runner.reconcile_orphaned_runs(airflow_setup.airflow_home())  # whatever ran before ended
    asked: list[str] = []
    ask = airflow_runs._call

    def recording(env, operation, *args, **kwargs):
        asked.append(operation)
        return ask(env, operation, *args, **kwargs)

    monkeypatch.setattr(airflow_runs, "_call", recording)
    with deployment_mail_sink("ml-platform@example.org") as sink:
        assert runner.run_pipeline("digits", {"promote": False}) == 0
    assert asked == []
    assert sink.mails == []  # passed and kept from champion as asked: no news
    (run,) = [r for r in runs_of(mlflow_client, "digits") if r.data.tags["strategy"] != "tpu"]
    assert run.data.params["training.promote"] == "False"
    assert run.data.tags["gate.passed"] == "True"
    assert run.data.tags["stratoflow.registered_version"] == "1"
    assert model_registry.alias_targets(mlflow_client, "stratoflow-digits") == {"challenger": "1"}
    printed = capsys.readouterr().out
    assert "version 1 (aliases: challenger)" in printed
    run_id = run.data.tags["airflow.run_id"]
    summary = reports.describe_dag_run("digits", "retrain_digits", run_id)
    assert printed.endswith(runner.format_summary("digits", run_id, summary))


@pytest.fixture
def store_refusing_to_finish_registered_runs(tmp_path_factory):
    """A fresh SQLite MLflow store that fails, for real, the first write after registering: a
    trigger aborts marking FINISHED a run that carries `stratoflow.registered_version` (set by
    `stratoflow.tracking.model_registry.register` as its last write), so `log_and_register` fails in
    `mlflow_runs.finish_run`, on both tries, with its version registered. Marking it FAILED
    works."""

    for mlflow_client in fresh_mlflow_client(tmp_path_factory, "mlflow-refusing"):
        mlflow_client.search_experiments()  # creates the schema
        store = Path(locations.tracking_uri().removeprefix("sqlite:///"))
        with sqlite3.connect(store) as connection:
            connection.execute(
                f"""CREATE TRIGGER refuse_to_finish BEFORE UPDATE OF status ON runs
                WHEN NEW.status = 'FINISHED' AND EXISTS (SELECT 1 FROM tags
                    WHERE tags.run_uuid = NEW.run_uuid AND tags.key = '{names.VERSION_TAG}')
                BEGIN SELECT RAISE(ABORT, 'the store refuses to finish this run'); END"""
            )
        yield mlflow_client


def test_a_run_that_fails_after_registering_deletes_its_version_and_aliases(
    store_refusing_to_finish_registered_runs,
):
    from stratoflow.tracking import model_registry

    mlflow_client = store_refusing_to_finish_registered_runs
    assert runner.run_pipeline("digits", {}) == 1
    (run,) = runs_of(mlflow_client, "digits")
    assert run.info.status == "FAILED"
    # It failed after registering (and promoting) version 1 ...
    assert run.data.tags["stratoflow.registered_version"] == "1"
    assert run.data.tags["gate.passed"] == "True"
    # ... and the failure callback deleted the version, and with it both aliases.
    assert list(mlflow_client.search_model_versions("name = 'stratoflow-digits'")) == []
    assert model_registry.alias_targets(mlflow_client, "stratoflow-digits") == {}
    assert not locations.run_dir("retrain_digits", run.data.tags["airflow.run_id"]).exists()


@contextlib.contextmanager
def mlflow_pointed_at(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking and registry URIs set to `uri`, then put back.

    An earlier test module may have set them (and `set_tracking_uri` also writes
    `$MLFLOW_TRACKING_URI`), so the fluent API would otherwise read another store.
    """
    import mlflow

    saved = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    saved_env = os.environ.get(locations.TRACKING_URI_ENV)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved[0])
        mlflow.set_registry_uri(saved[1])
        if saved_env is None:
            os.environ.pop(locations.TRACKING_URI_ENV, None)
        else:
            os.environ[locations.TRACKING_URI_ENV] = saved_env


def mlflow_names_section() -> str:
    """The docs page "MLflow names" up to its first subsection: the names of a retrain run."""
    text = MLFLOW_NAMES_PAGE.read_text()
    end = text.find("\n## ")
    return text[: end if end >= 0 else None]


def names_bullet(section: str, label: str) -> str:
    """The text of the bullet `- **label**...` up to the next bullet."""
    match = re.search(rf"^- \*\*{re.escape(label)}\*\*(.*?)(?=^- \*\*|\Z)", section, re.S | re.M)
    assert match, f"{MLFLOW_NAMES_PAGE}: no bullet {label!r}"
    return match.group(1)


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_the_run_carries_every_mlflow_name_the_docs_list(
    default_mnist_run, mlflow_client, tf_runtime, tmp_path
):
    """The docs' "MLflow names" page, parsed, checked against the default mnist run."""
    import mlflow.keras
    import numpy as np

    from stratoflow.config.spec import load_spec
    from stratoflow.data import datasets

    assert default_mnist_run[0] == 0
    run = runs_of(mlflow_client, "mnist")[0]
    section = mlflow_names_section()
    config = json.loads(
        Path(
            mlflow_client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
        ).read_text()
    )

    # Run name `<pipeline>-<strategy>-<airflow run id>`.
    (template,) = re.findall(r"run name\s+`([^`]+)`", section)
    values = {"pipeline": "mnist", "strategy": "one_device"}
    values["airflow run id"] = run.data.tags["airflow.run_id"]
    assert run.info.run_name == re.sub(r"<([^>]+)>", lambda m: values[m.group(1)], template)

    tags = [name for name in backticked(names_bullet(section, "tags")) if ":" not in name]
    assert len(tags) == 25, tags
    member_tags = [tag for tag in tags if tag.endswith(".<member>")]
    assert member_tags == ["node.<member>"]
    assert run.data.tags.get("node.all_members")  # the local launcher: every member here
    assert [tag for tag in tags if tag not in member_tags and not run.data.tags.get(tag)] == []
    assert run.data.tags["dataset"] == f"{config['dataset']['name']}:{config['dataset']['version']}"

    params = backticked(names_bullet(section, "params"))
    assert "training.strategy" in params and "model.hyperparameters.<name>" in params
    for param in params:
        if param.endswith(".<name>"):
            prefix = param.removesuffix("<name>")
            hyperparameters = config["model"]["hyperparameters"]
            assert hyperparameters, "the mnist spec has hyperparameters"
            for name, value in hyperparameters.items():
                assert run.data.params[prefix + name] == str(value), prefix + name
        else:
            node = config
            for part in param.split("."):
                node = node[part]
            assert run.data.params[param] == str(node), param

    metrics_text = names_bullet(section, "metrics per epoch")
    per_epoch, once = metrics_text.split("Once per run")
    per_epoch_names = [name for name in backticked(per_epoch) if name != "step"]
    assert tuple(per_epoch_names) == names.EPOCH_METRICS
    for name in per_epoch_names:
        assert metric_steps(mlflow_client, run.info.run_id, name) == list(range(1, 9)), name
    once_names = [name for name in backticked(once) if not name.isupper()]
    assert len(once_names) == 17, once_names
    # Logged only after a recovery inside the task, and this run had none.
    assert run.data.metrics["restarts"] == 0
    once_names.remove("recovery_seconds")
    logged = set(run.data.metrics)
    for name in once_names:
        if name.endswith("<k>"):
            expected = {name.replace("<k>", str(k)) for k in range(10)}
            assert expected <= logged, name
        elif name.endswith("…"):
            assert any(key.startswith(name.removesuffix("…")) for key in logged), name
        else:
            assert name in logged, name

    # The dataset input: `<tfds name>:<version>`, digest = the prepared files' fingerprint.
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == run.data.tags["dataset"]
    reference = datasets.prepare_dataset(load_spec("mnist").dataset)
    variant_dir = Path(reference.data_dir) / reference.name / reference.version
    (variant_dir / datasets.FINGERPRINT_CACHE).unlink(missing_ok=True)  # hash the files again
    assert dataset_input.dataset.digest == datasets.fingerprint(variant_dir)[:36]

    # The model: the champion loads with the page's own line, and predicts.
    (model_uri,) = re.findall(r'`mlflow\.keras\.load_model\("(models:/[^"]+)"\)`', section)
    assert model_uri == "models:/stratoflow-mnist@champion"
    with mlflow_pointed_at(locations.tracking_uri()):  # as a user's shell would be
        model = mlflow.keras.load_model(model_uri)
    images, labels = datasets.load_arrays(reference, "test")
    predictions = np.asarray(model.predict(images[:500], verbose=0))
    assert predictions.shape == (500, 10)
    assert np.mean(predictions.argmax(axis=1) == labels[:500]) >= 0.9


def runs_of_dag_run(mlflow_client, pipeline: str, run_id: str) -> list[Any]:

    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
    if experiment is None:
        return []
    return [
        run
        for run in mlflow_client.search_runs([experiment.experiment_id])
        if run.data.tags.get("airflow.run_id") == run_id
    ]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"strategy": "mirrored", "replicas": 2, "batch_size": 33},
            "run conf.batch_size 33 must be divisible by replicas 2",
        ),
        # digits' MLP has Dropout: refused from the spec, no longer by the training process.
        ({"strategy": "central_storage"}, "run conf.strategy 'central_storage' cannot train"),
    ],
    ids=["batch_size", "central_storage"],
)
def test_a_conf_the_spec_refuses_fails_in_prepare_at_once_without_an_mlflow_run(
    mlflow_client, conf: dict[str, Any], message: str
) -> None:
    run_id = f"refused__{time.time_ns()}"
    # The digits spec retries once after 10 s: a retried refusal would show 2 tries.
    result = dags_test("retrain_digits", conf, run_id)

    assert result.returncode != 0
    assert result.state == "failed"
    assert result.tries == {"prepare_dataset": 1}, result.output[-3000:]
    assert "AirflowFailException" in result.output
    assert message in result.output
    assert runs_of_dag_run(mlflow_client, "digits", run_id) == []


def test_a_failed_run_with_id_dot_removes_its_own_folder_and_no_other(mlflow_client) -> None:
    """Run id "." (Airflow accepts it) fails in prepare_dataset; the clean-up that follows must
    not take the DAG's other runs' folders with it."""
    dag_id = "retrain_digits"
    others = ["manual__2026-12-02T19:02:11+00:00", "manual__2026-12-02T19_02_11_00_00", "a.b"]
    for other in [*others, "."]:
        folder = locations.run_dir(dag_id, other)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.keras").write_text(other)

    result = dags_test(dag_id, {"strategy": "mirrored", "replicas": 2, "batch_size": 33}, ".")

    assert result.state == "failed", result.output[-3000:]
    for other in others:
        assert (locations.run_dir(dag_id, other) / "model.keras").read_text() == other
    assert not locations.run_dir(dag_id, ".").exists()  # the clean-up ran, for this run
    assert result.tries == {"prepare_dataset": 1}
