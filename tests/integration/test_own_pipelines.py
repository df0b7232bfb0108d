"""A user's own pipelines, run end to end through Airflow (`airflow dags test`, as `make run`
does): one written into a folder outside the repository (its own model module, its own image
folder of PNG files read with TFDS's `ImageFolder`, its own preprocessing) and found through
`STRATOFLOW_PIPELINES_PATH`, under `one_device` and `multi_worker_mirrored`, whose model builder
writes down the environment of each process it runs in (none may hold the deployment's secrets,
which `airflow dags test` is given as sentinels); and the bundled
regression pipeline (diabetes), which passes its MAE gate and registers a champion that answers
with predictions; then both champions served over HTTP by `stratoflow serve-model`. A broken user
pipeline is tested where Airflow parses it
(`tests/unit/stratoflow/test_dags.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from stratoflow.cli import main, runner
from stratoflow.config import locations, names
from tests.support.images import write_bar_images
from tests.support.processes import ServeModel
from tests.support.secret_sentinels import (
    MLFLOW_ACCOUNT,
    SECRET_VARIABLES,
    dumps,
    env_probe,
    leaked,
)

pytestmark = pytest.mark.integration

SIZE = 12
CLASSES = ("horizontal", "vertical")
PER_SPLIT = {"train": 48, "validation": 12, "test": 12}

SHAPES_YAML = """\
description: Bars in 12x12 PNG images, horizontal or vertical; a user's own pipeline.
task: classification
dataset:
  name: shapes_bars
  image_folder: images
  image_shape: [12, 12, 1]
  preprocess: "augment:centre"
model:
  builder: "bars_model:build"
  hyperparameters: {filters: 4}
optimizer: {name: sgd, momentum: 0.9}
training:
  epochs: 4
  batch_size: 16
  learning_rate: 0.05
evaluation: {metric: test_accuracy, min: 0.8, max_regression: 0.2}
registered_model: test-shapes-bars
schedule: null
retries: 0
"""

BARS_MODEL = '''
import keras

from . import env_probe


def build(features, target, filters=4):
    """A user's model: one convolution, then logits per class."""
    env_probe.dump("model builder")  # the test reads back the environment it was given
    return keras.Sequential(
        [
            keras.Input(shape=features.shape),
            keras.layers.Conv2D(filters, 3, activation="relu"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(target.num_outputs),
        ]
    )
'''

AUGMENT = '''
from . import env_probe


def centre(image, label):
    """A user's preprocessing: pixel values around 0 instead of in [0, 1]."""
    env_probe.dump("preprocessing")  # traced once per input pipeline a process builds
    return image - 0.5, label
'''


@pytest.fixture(scope="module")
def environment_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the shapes pipeline's model builder writes down each process's environment."""
    return tmp_path_factory.mktemp("environment-dumps")


@pytest.fixture(scope="module")
def own_pipelines(tmp_path_factory: pytest.TempPathFactory, environment_dumps: Path) -> Path:
    """A team's folder of pipelines, outside the repository, on STRATOFLOW_PIPELINES_PATH."""
    team = tmp_path_factory.mktemp("team-pipelines")
    assert locations.PROJECT_ROOT not in team.parents
    shapes = team / "shapes"
    shapes.mkdir()
    (shapes / "pipeline.yaml").write_text(SHAPES_YAML)
    (shapes / "bars_model.py").write_text(BARS_MODEL)
    (shapes / "env_probe.py").write_text(env_probe(environment_dumps))
    (shapes / "augment.py").write_text(AUGMENT)
    write_bar_images(shapes / "images", PER_SPLIT, CLASSES, SIZE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STRATOFLOW_PIPELINES_PATH", str(team))
        yield team


@pytest.fixture(scope="module")
def deployment_secrets() -> Iterator[None]:
    """The environment `airflow dags test` (and so every task) runs with holds the deployment's
    secrets (the MLflow service account among them) and a team's variable for its pipeline code."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**SECRET_VARIABLES, **MLFLOW_ACCOUNT}.items():
            patch.setenv(name, value)
        patch.setenv("STRATOFLOW_PIPELINE_ENV_TEAM_SETTING", "team-value")
        yield


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    from stratoflow.tracking import mlflow_runs

    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield mlflow_runs.client()


def _runs(mlflow_client, pipeline: str) -> list:
    experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
    return mlflow_client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time ASC"]
    )


@pytest.mark.parametrize(
    "conf",
    [{}, {"strategy": "multi_worker_mirrored", "workers": 2}],
    ids=["one_device", "multi_worker_mirrored"],
)
def test_a_pipeline_of_its_own_trains_and_registers_through_airflow(
    own_pipelines, mlflow_client, conf, tf_runtime, deployment_secrets, environment_dumps, capfd
):
    # tf_runtime: the served model runs in this process, whose TensorFlow later tests share
    # (its logical CPUs must be set before the first op).
    import mlflow

    from stratoflow.data.datasets import load_arrays

    earlier = {probe["file"] for probe in dumps(environment_dumps)}
    assert runner.run_pipeline("shapes", conf) == 0
    _assert_model_builder_had_no_secrets(
        [probe for probe in dumps(environment_dumps) if probe["file"] not in earlier],
        workers=conf.get("workers", 1),
    )
    # The run's output (Airflow's and the tasks' logs) says nothing misleading: the cache
    # decision names the image folder's split folder it reads (not "0 file(s)"), and no warning
    # says the model was saved without the signature it is logged with.
    output = "".join(capfd.readouterr())
    images = (own_pipelines / "shapes" / "images").resolve()
    for role in ("train", "validation"):
        assert f", from the images in {images / role}, budget " in output, output[-3000:]
    assert "file(s)" not in output
    assert "without specifying model signature" not in output
    run = _runs(mlflow_client, "shapes")[-1]
    assert run.info.status == "FINISHED"
    assert run.data.tags["strategy"] == conf.get("strategy", "one_device")
    assert run.data.tags["num_workers"] == str(conf.get("workers", 1))
    assert run.data.params["model.builder"] == "bars_model:build"
    assert run.data.params["optimizer.name"] == "sgd"
    assert run.data.metrics["test_accuracy"] >= 0.8
    assert run.data.tags["gate.passed"] == "True"
    # The MLflow input is the image folder itself, with its fingerprint.
    (dataset_input,) = run.inputs.dataset_inputs
    assert str(own_pipelines / "shapes" / "images") in dataset_input.dataset.source
    version = run.data.tags[names.VERSION_TAG]
    champion = mlflow_client.get_model_version_by_alias("test-shapes-bars", "champion")
    assert str(champion.version) == version

    # The served champion answers with class probabilities and the class, on the same images
    # the pipeline reads (preprocessing included: the model was trained on centred pixels).
    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data.datasets import prepare_dataset

    spec = resolve_plan("shapes", {}).spec
    reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    images, labels = load_arrays(reference, "test")
    answer = mlflow.pyfunc.load_model("models:/test-shapes-bars@champion").predict(images)
    assert list(answer.columns) == [
        "probability_horizontal",
        "probability_vertical",
        "predicted_class",
        "predicted_class_id",
    ]
    assert (answer["predicted_class_id"].to_numpy() == labels).mean() >= 0.8
    assert set(answer["predicted_class"]) <= set(CLASSES)


def _assert_model_builder_had_no_secrets(probes: list[dict], workers: int) -> None:
    """The model builder and the preprocessing ran in the first task's own-code check and in
    each training process, each with the team's variable, none with a secret of the
    deployment's, nor anything of MLflow's; neither ran in the process of the Airflow tasks
    (docs/explanation/trust-model.md)."""
    programs: dict[tuple[str, str], set[int]] = {}
    for probe in probes:
        key = (probe["where"], Path(probe["argv"][0]).name)
        programs.setdefault(key, set()).add(probe["pid"])
    assert {key: len(pids) for key, pids in programs.items()} == {
        ("model builder", "own_code_check.py"): 1,
        ("model builder", "worker.py"): workers,
        ("preprocessing", "own_code_check.py"): 1,
        ("preprocessing", "worker.py"): workers,
    }, [(probe["where"], probe["argv"]) for probe in probes]
    for probe in probes:
        environ, program = probe["environ"], Path(probe["argv"][0]).name
        assert leaked(environ) == [], f"{program} was handed {leaked(environ)}"
        assert environ["TEAM_SETTING"] == "team-value", program


def test_the_regression_pipeline_passes_its_gate_and_serves_predictions(mlflow_client, tf_runtime):
    import mlflow

    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data.datasets import load_arrays, prepare_dataset

    assert runner.run_pipeline("diabetes", {"epochs": 30}) == 0
    (run,) = _runs(mlflow_client, "diabetes")
    assert run.info.status == "FINISHED"
    assert run.data.tags["gate.passed"] == "True"
    assert run.data.metrics["test_mae"] <= 50.0
    assert {"test_loss", "test_rmse"} <= set(run.data.metrics)
    assert "test_accuracy" not in run.data.metrics
    for key in ("mae", "val_mae"):
        history = mlflow_client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(1, 31)), key
    artifacts = {item.path for item in mlflow_client.list_artifacts(run.info.run_id)}
    assert names.RESIDUALS_ARTIFACT in artifacts
    assert names.CONFUSION_MATRIX_ARTIFACT not in artifacts
    champion = mlflow_client.get_model_version_by_alias("stratoflow-diabetes", "champion")
    assert str(champion.version) == run.data.tags[names.VERSION_TAG]

    spec = resolve_plan("diabetes", {}).spec
    reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    columns, targets = load_arrays(reference, "test")
    import pandas as pd

    answer = mlflow.pyfunc.load_model("models:/stratoflow-diabetes@champion").predict(
        pd.DataFrame(columns)
    )
    assert list(answer.columns) == ["prediction"]
    mae = float(np.abs(answer["prediction"].to_numpy() - targets).mean())
    assert mae == pytest.approx(run.data.metrics["test_mae"], rel=1e-4)


def test_serve_model_answers_over_http_on_loopback_and_stops_with_its_workers(
    own_pipelines, mlflow_client, tmp_path
):
    """`stratoflow serve-model` on the two champions registered above: an image classifier
    (shapes) and a tabular regression (diabetes), as a user would, with a real HTTP client."""
    import httpx
    import pandas as pd

    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data.datasets import load_arrays, prepare_dataset

    secret = "serve-model-test-password-" + os.urandom(6).hex()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_USERNAME": "serving-test-user",
        "MLFLOW_TRACKING_PASSWORD": secret,
    }
    private_tmp = {}  # where each CLI keeps its copy of the model
    for name in ("shapes", "diabetes"):
        private_tmp[name] = tmp_path / f"tmp-{name}"
        private_tmp[name].mkdir()
    shapes = ServeModel(
        "shapes", env={**env, "TMPDIR": str(private_tmp["shapes"])}, log=tmp_path / "shapes.log"
    )
    diabetes = ServeModel(
        "diabetes",
        "--workers",
        "2",
        env={**env, "TMPDIR": str(private_tmp["diabetes"])},
        log=tmp_path / "diabetes.log",
    )
    try:
        shapes_url = shapes.wait_until_serving()
        diabetes_url = diabetes.wait_until_serving()
        banner = "\n".join(diabetes.lines)
        champion = mlflow_client.get_model_version_by_alias("stratoflow-diabetes", "champion")
        assert f"stratoflow-diabetes version {champion.version} (alias champion)" in banner

        # The printed example works as printed, and answers as the model's task wants.
        answer = json.loads(subprocess.check_output(shapes.example_curl(), timeout=60))
        assert set(answer["predictions"][0]) == {
            "probability_horizontal",
            "probability_vertical",
            "predicted_class",
            "predicted_class_id",
        }
        answer = json.loads(subprocess.check_output(diabetes.example_curl(), timeout=60))
        assert set(answer["predictions"][0]) == {"prediction"}

        # Real requests: the test split, through HTTP.
        spec = resolve_plan("shapes", {}).spec
        reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
        images, labels = load_arrays(reference, "test")
        reply = httpx.post(
            f"{shapes_url}/invocations", json={"inputs": images.tolist()}, timeout=60
        )
        assert reply.status_code == 200, reply.text
        predicted = pd.DataFrame(reply.json()["predictions"])
        probabilities = predicted[["probability_horizontal", "probability_vertical"]].to_numpy()
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        assert (predicted["predicted_class_id"].to_numpy() == labels).mean() >= 0.8
        assert set(predicted["predicted_class"]) <= set(CLASSES)

        spec = resolve_plan("diabetes", {}).spec
        reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
        columns, targets = load_arrays(reference, "test")
        table = pd.DataFrame(columns)
        reply = httpx.post(
            f"{diabetes_url}/invocations",
            json={"dataframe_split": json.loads(table.to_json(orient="split", index=False))},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        predictions = np.array([row["prediction"] for row in reply.json()["predictions"]])
        run = mlflow_client.get_run(champion.run_id)
        mae = float(np.abs(predictions - targets).mean())
        assert mae == pytest.approx(run.data.metrics["test_mae"], rel=1e-4)

        # Without the model's columns: a 4xx with MLflow's own message, naming what is missing.
        reply = httpx.post(
            f"{diabetes_url}/invocations",
            json={"dataframe_split": {"columns": ["age"], "data": [[0.01]]}},
            timeout=60,
        )
        assert 400 <= reply.status_code < 500, reply.text
        assert "bmi" in reply.text and "missing" in reply.text.lower(), reply.text

        # Loopback only, and no MLflow credential in the scoring server: neither on a command
        # line nor in its environment (it serves a local copy; only the CLI holds them).
        for server, url in ((shapes, shapes_url), (diabetes, diabetes_url)):
            port = int(url.rsplit(":", 1)[1])
            processes = server.tree()
            assert processes, server.tail()
            listening = [
                connection.laddr
                for process in processes
                for connection in process.net_connections(kind="inet")
                if connection.status == psutil.CONN_LISTEN
            ]
            assert listening, f"no listening socket: {server.tail()}"
            assert {address.ip for address in listening} == {"127.0.0.1"}, listening
            assert {address.port for address in listening} == {port}, listening
            for process in processes:
                assert secret not in " ".join(process.cmdline())
                assert not {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} & set(
                    process.environ()
                ), process.cmdline()
            assert secret not in " ".join(psutil.Process(server.process.pid).cmdline())

        # Ctrl-C (SIGINT) stops the CLI, the scoring server and its workers, and removes the
        # copy; a SIGKILLed CLI leaves no orphan either (the server gets SIGTERM), only its copy.
        trees = {server: server.tree() for server in (diabetes, shapes)}
        assert len(trees[diabetes]) >= 3, [p.cmdline() for p in trees[diabetes]]  # uvicorn + 2
        started = time.monotonic()
        diabetes.process.send_signal(signal.SIGINT)
        shapes.process.kill()
        assert diabetes.process.wait(30) == 130, diabetes.tail()
        assert shapes.process.wait(30) == -signal.SIGKILL
        for processes in trees.values():
            gone, alive = psutil.wait_procs(processes, timeout=15)
            assert not alive, [p.cmdline() for p in alive]
        assert time.monotonic() - started < 20
        assert not list(private_tmp["diabetes"].iterdir())
        assert [path.name[:17] for path in private_tmp["shapes"].iterdir()] == ["stratoflow-serve-"]
    finally:
        shapes.kill()
        diabetes.kill()


def test_serve_model_refuses_an_alias_without_a_version(mlflow_client, caplog):
    assert main.main(["serve-model", "diabetes", "--alias", "nope", "--port", "0"]) == 1
    assert "registered model 'stratoflow-diabetes' has no version with alias 'nope'" in caplog.text
    assert "champion" in caplog.text  # the aliases it has


def test_a_broken_pipeline_is_in_airflows_import_errors_and_the_others_are_dags(
    tmp_path: Path,
):
    """What the Airflow UI shows: Airflow's own parse (`airflow dags reserialize`) records the
    broken pipeline as the import error of `dags/pipeline_errors.py`, and every other pipeline
    as a DAG that is not stale (the API and the scheduler start no run of a stale DAG)."""
    import json
    import subprocess
    import sys

    from stratoflow.services import airflow_setup

    broken = tmp_path / "team" / "broken"
    broken.mkdir(parents=True)
    spec = (locations.PROJECT_ROOT / "pipelines" / "digits" / "pipeline.yaml").read_text()
    (broken / "pipeline.yaml").write_text(spec.replace("builder: mlp", "builder: resnet"))
    home = tmp_path / "airflow"
    home.mkdir()
    env = {
        **airflow_setup.airflow_env(home),
        "STRATOFLOW_PIPELINES_PATH": str(tmp_path / "team"),
    }
    airflow = str(Path(sys.executable).parent / "airflow")

    def airflow_cli(*args: str) -> str:
        done = subprocess.run(
            [airflow, *args], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: import errors were listed
        return done.stdout

    airflow_cli("db", "migrate")
    airflow_cli("dags", "reserialize")
    errors = airflow_cli("dags", "list-import-errors", "-o", "plain")
    expected = (
        f"- pipeline 'broken': {broken / 'pipeline.yaml'}: model.builder 'resnet' is not a known "
        "model builder; allowed: mlp, small_cnn, or an import path 'module:function'"
    )
    assert "pipeline_errors.py" in errors
    for dag_file in ("retrain.py", "benchmark_strategies.py", "refresh_datasets.py"):
        assert dag_file not in errors, errors
    assert errors.count(expected) == 1, errors
    listed = airflow_cli("dags", "list", "-o", "plain")
    for pipeline in ("mnist", "digits", "penguins", "diabetes"):
        assert names.retrain_dag_id(pipeline) in listed, listed
        # The JSON is the last line (a warning about graphviz may come first); values are text.
        printed = airflow_cli("dags", "details", names.retrain_dag_id(pipeline), "-o", "json")
        [details] = json.loads(printed.strip().splitlines()[-1])
        assert (details["is_stale"], details["has_import_errors"]) == ("False", "False"), details
    assert "retrain_broken" not in listed


def test_a_failed_run_ends_naming_the_failing_task_and_its_error(tmp_path: Path, mlflow_client):
    """`stratoflow run` of a pipeline whose model builder raises: the first task refuses it
    through Airflow, and the last lines the user sees name that task and the exception it
    raised (not only "the task logs are above", 50 lines below the traceback)."""
    import os
    import subprocess
    import sys

    from tests.unit.stratoflow.training.test_own_code_check import write_pipeline

    folder = write_pipeline(
        tmp_path,
        "raising",
        {"model.py": "def build(features, target, width=8):\n    raise RuntimeError('boom')\n"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "stratoflow.cli.main", "run", "raising"],
        env={**os.environ, "STRATOFLOW_PIPELINES_PATH": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 1, done.stdout[-3000:]
    last = "\n".join(done.stdout.strip().splitlines()[-5:])
    assert (
        f"prepare_dataset failed: SpecError: {folder / 'pipeline.yaml'}: model.builder "
        "'model:build' raised RuntimeError: boom" in last
    ), last
    assert "failed: prepare_dataset" in last and "retrain_raising" in last, last
    assert "Traceback" not in last, last
