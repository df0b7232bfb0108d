"""The `stratoflow` command line and the local runner behind `stratoflow run` / `make run`.

Everything here runs in-process and starts no Airflow; a real `stratoflow run` through Airflow,
its summary and `stratoflow compare` are tested in `tests/integration/test_retrain_dag.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stratoflow.cli import main, runner
from stratoflow.config import settings
from stratoflow.config.options import STRATEGIES
from stratoflow.config.parsing import SpecError
from stratoflow.services import airflow_setup
from stratoflow.tracking import model_serving
from tasks.run_context import resolve_config


def test_list_shows_every_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["list"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["pipeline", "dataset", "model", "schedule", "registered_model"]
    mnist = next(line for line in lines if line.startswith("mnist "))
    for expected in ("stratoflow_mnist5k 1.0.0", "small_cnn", "0 3 * * 1", "stratoflow-mnist"):
        assert expected in mnist
    digits = next(line for line in lines if line.startswith("digits "))
    for expected in ("stratoflow_digits 1.0.0", "mlp", "30 2 * * *", "stratoflow-digits"):
        assert expected in digits


@pytest.mark.parametrize("command", ["run", "compare", "serve-model"])
def test_unknown_pipeline_is_a_usage_error_listing_the_pipelines(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main.main([command, "nope"])

    assert exit_info.value.code == 2
    listed = "unknown pipeline 'nope'; available: diabetes, digits, mnist, penguins"
    assert listed in capsys.readouterr().err


def test_bad_strategy_is_refused_by_argparse(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "run_pipeline", _must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", "mnist", "--strategy", "bogus"])

    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --strategy: invalid choice: 'bogus'" in error
    for name in STRATEGIES:
        assert name in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "3"], "argument --replicas: invalid choice: 3"),
        (["--loop", "keras"], "argument --loop: invalid choice: 'keras'"),
        (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
        (["--conf", "{epochs: 2}"], "--conf is not valid JSON"),
        (["--conf", "[1]"], "--conf must be a JSON object, got list"),
    ],
)
def test_bad_run_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.setattr(runner, "run_pipeline", _must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", "mnist", *argv])

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_override_the_conf_json() -> None:
    conf = main.build_conf(
        '{"epochs": 9, "seed": 7, "strategy": "auto"}',
        {"strategy": "mirrored", "replicas": 4, "loop": None, "promote": False},
    )
    assert conf == {"epochs": 9, "seed": 7, "strategy": "mirrored", "replicas": 4, "promote": False}


@pytest.mark.parametrize(
    ("text", "message"), [("[1]", "must be a JSON object"), ("{", "not valid")]
)
def test_a_bad_conf_json_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        main.build_conf(text, {})


def test_compare_run_ids_are_checked_before_mlflow_is_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main.main(["compare", "mnist", "--run", "x' OR '1'='1"])
    assert "argument --run: not an MLflow run id" in capsys.readouterr().err


def test_compare_limit_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main(["compare", "mnist", "--limit", "0"])
    assert "expected a positive integer" in capsys.readouterr().err


# --- the runner -----------------------------------------------------------------------------


def test_airflow_env_points_airflow_and_the_stores_at_explicit_places(tmp_path: Path) -> None:
    env = airflow_setup.airflow_env(tmp_path / "af", base={"PATH": "/bin", "PYTHONPATH": "/x"})

    assert env["PATH"] == "/bin"
    assert env["AIRFLOW_HOME"] == str(tmp_path / "af")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / 'af'}/airflow.db"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(settings.PROJECT_ROOT / "dags")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert int(env["AIRFLOW__CORE__PARALLELISM"]) <= 4
    assert env["STRATOFLOW_HOME"] == str(settings.state_dir())
    assert env["MLFLOW_TRACKING_URI"] == settings.tracking_uri()
    assert env["TFDS_DATA_DIR"] == str(settings.data_dir())
    assert env["PYTHONPATH"].split(":") == [str(settings.PROJECT_ROOT), "/x"]


def test_the_runner_home_is_inside_the_state_dir() -> None:
    assert airflow_setup.airflow_home() == settings.state_dir() / "airflow"


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"strategy": "bogus"}, "Invalid input for param strategy: 'bogus' is not one of"),
        ({"epochs": 0}, "Invalid input for param epochs: 0 is less than the minimum of 1"),
        ({"optimiser": "sgd"}, "run conf: unknown key 'optimiser'"),
        ({"strategy": "mirrored", "replicas": 4, "batch_size": 30}, "divisible by replicas 4"),
        (
            {"learning_rate": float("nan")},
            "Invalid input for param learning_rate: nan should not be valid under "
            "{'title': 'NaN, Infinity or -Infinity'",
        ),
        ({"learning_rate": float("inf")}, "Invalid input for param learning_rate: inf is greater"),
        ({"cluster": 5}, "Invalid input for param cluster: 5 is not of type 'null', 'string'"),
        ({"strategy": "parameter_server", "cluster": "ps:1"}, "run conf.cluster is not valid JSON"),
        (
            {"strategy": "parameter_server", "cluster": '{"worker": ["w:1"]}'},
            'run conf.cluster must be a JSON object like {"worker"',
        ),
        (
            {"launcher": "slurm"},
            "Invalid input for param launcher: 'slurm' is not one of ['local', 'ray']",
        ),
        ({"max_restarts": -1}, "Invalid input for param max_restarts: -1 is less than the minimum"),
        ({"max_restarts": 11}, "Invalid input for param max_restarts: 11 is greater than the max"),
        ({"placement": "anywhere"}, "Invalid input for param placement: 'anywhere' is not one of"),
        ({"ray_address": "head:6379"}, "run conf.ray_address applies to launcher 'ray' only"),
        (
            {
                "launcher": "ray",
                "ray_address": "head:6379",
                "strategy": "parameter_server",
                "cluster": '{"worker": ["w:1"], "ps": ["p:2"]}',
            },
            "run conf.cluster (standing servers) cannot be combined with launcher 'ray'",
        ),
    ],
)
def test_check_conf_refuses_what_airflow_or_the_first_task_would(
    conf: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as error:
        runner.check_conf("mnist", conf)
    assert message in str(error.value)


def test_check_conf_refuses_central_storage_for_a_model_with_dropout() -> None:
    with pytest.raises(SpecError, match="'central_storage' cannot train model 'mlp'"):
        runner.check_conf("digits", {"strategy": "central_storage"})


def test_check_conf_accepts_a_valid_conf() -> None:
    runner.check_conf("mnist", {"strategy": "mirrored", "replicas": 2, "loop": "fit"})


@pytest.mark.parametrize("cluster", [None, "", "omitted"])
def test_no_standing_cluster_is_null_empty_or_omitted(
    cluster: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The UI's trigger form sends the Param's default, null; the CLI and REST may send "".
    conf = {"strategy": "parameter_server"} | ({} if cluster == "omitted" else {"cluster": cluster})
    runner.check_conf("mnist", conf)
    monkeypatch.delenv(settings.CLUSTER_ENV, raising=False)
    assert resolve_config("mnist", conf).training.cluster == ""
    standing = '{"worker": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}'
    monkeypatch.setenv(settings.CLUSTER_ENV, standing)
    assert resolve_config("mnist", conf).training.cluster == standing


@pytest.mark.parametrize("address", [None, "", "omitted"])
def test_launcher_ray_takes_its_address_from_the_run_or_the_deployment(
    address: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {"launcher": "ray"} | ({} if address == "omitted" else {"ray_address": address})
    monkeypatch.delenv(settings.RAY_ADDRESS_ENV, raising=False)
    with pytest.raises(SpecError, match="launcher 'ray' needs the Ray cluster's address"):
        runner.check_conf("mnist", conf)
    monkeypatch.setenv(settings.RAY_ADDRESS_ENV, "ray-head:6379")
    runner.check_conf("mnist", conf)
    assert resolve_config("mnist", conf).training.ray_address == "ray-head:6379"
    named = resolve_config("mnist", {"launcher": "ray", "ray_address": "other:6379"})
    assert named.training.ray_address == "other:6379"  # the run's own address wins


def test_a_standing_cluster_is_not_used_by_launcher_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    standing = '{"worker": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}'
    monkeypatch.setenv(settings.CLUSTER_ENV, standing)
    conf = {"strategy": "parameter_server", "launcher": "ray", "ray_address": "head:6379"}
    assert resolve_config("mnist", conf).training.cluster == ""


def test_run_pipeline_refuses_a_bad_conf_before_starting_airflow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(subprocess, "run", _must_not_run)

    assert runner.run_pipeline("mnist", {"loop": "x"}) == 1
    assert "Invalid input for param loop" in caplog.text


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_before_the_dag_run_exits_with_its_code_and_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, signum: int, code: int
) -> None:
    """The stopped runs themselves are in tests/integration/test_stopping_a_run.py."""

    def signalled(pipeline: str, conf: dict[str, Any]) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(10)  # the handler interrupts this

    handler = signal.getsignal(signum)
    monkeypatch.setattr(runner, "check_conf", signalled)
    monkeypatch.setattr(subprocess, "run", _must_not_run)

    assert runner.run_pipeline("mnist", {}) == code
    name = signal.Signals(signum).name
    assert caplog.text.count("Stopped by") == 1
    assert f"Stopped by {name}; no DAG run was in progress." in caplog.text
    assert signal.getsignal(signum) is handler  # restored for whatever runs next


def test_serve_model_fails_fast_when_mlflow_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracking server that does not answer: refused in seconds (MLflow's client would retry
    for minutes), naming the URI; no scoring server is started."""
    import socket

    with socket.socket() as unused:  # a loopback port nothing listens on
        unused.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{unused.getsockname()[1]}"
    monkeypatch.setenv(settings.TRACKING_URI_ENV, uri)
    monkeypatch.setattr(model_serving, "download_model", _must_not_run)

    started = time.monotonic()
    assert main.main(["serve-model", "diabetes", "--port", "0"]) == 1
    assert time.monotonic() - started < 30
    assert f"MLflow at {uri} is unreachable" in caplog.text


def test_serve_model_refuses_a_tracking_store_that_does_not_exist(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A SQLite store that is not there is named, not created empty as a side effect."""
    store = tmp_path / "nothing-tracked" / "mlflow.db"
    monkeypatch.setenv(settings.TRACKING_URI_ENV, f"sqlite:///{store}")
    monkeypatch.setattr(model_serving, "download_model", _must_not_run)

    assert main.main(["serve-model", "diabetes", "--port", "0"]) == 1
    assert f"no MLflow tracking store at {store}" in caplog.text
    assert "stratoflow run diabetes" in caplog.text
    assert not store.exists()


def test_serve_model_refuses_a_port_in_use(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    monkeypatch.setattr(model_serving, "download_model", _must_not_run)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main.main(["serve-model", "diabetes", "--port", str(port)]) == 1
    assert f"port {port} on 127.0.0.1 is in use" in caplog.text
    assert "--port 0" in caplog.text  # how to get a free one


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "argument --port: expected a port from 0 to 65535, got '70000'"),
        (["--workers", "0"], "argument --workers: expected a positive integer, got '0'"),
    ],
)
def test_serve_model_flags_are_checked_by_argparse(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main.main(["serve-model", "diabetes", *flags])

    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"must not be called: {args} {kwargs}")


def test_compare_refuses_a_run_id_that_is_not_a_run_of_the_pipeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert main.main(["compare", "digits", "--run", "0" * 32]) == 1
    assert f"not a run of pipeline digits in {settings.tracking_uri()}: {'0' * 32}" in caplog.text


# --- stratoflow new-pipeline -----------------------------------------------------------------


@pytest.mark.parametrize("example", ["starter", "penguins"])
def test_new_pipeline_writes_a_folder_that_loads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    example: str,
) -> None:
    from stratoflow.config.spec import list_pipelines
    from stratoflow.training.validation import resolve_run

    assert main.main(["new-pipeline", "mine", "--from", example, "--dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"export STRATOFLOW_PIPELINES_PATH={tmp_path}" in printed
    assert "stratoflow run mine" in printed
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path))
    assert "mine" in list_pipelines()
    spec = resolve_run("mine", {})
    assert spec.registered_model == "mine"
    assert spec.folder == str(tmp_path / "mine")
    # Its own code and data are checked in tests/tasks/test_own_code.py (TensorFlow).
    # Written once: a second time is refused.
    assert main.main(["new-pipeline", "mine", "--dir", str(tmp_path)]) == 1
    assert "exists already; choose another name or --dir" in caplog.text


def test_new_pipeline_refuses_a_name_that_cannot_be_a_pipeline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert main.main(["new-pipeline", "my-model", "--dir", str(tmp_path)]) == 1
    assert "pipeline name 'my-model' is not valid" in caplog.text
    assert list(tmp_path.iterdir()) == []
