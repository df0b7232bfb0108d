"""The `stratoflow` command line and the local runner behind `stratoflow run` / `make run`.

Everything here runs in-process and starts no Airflow; a real `stratoflow run` through Airflow,
its summary and `stratoflow compare` are tested in `tests/integration/test_retrain_dag.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stratoflow.cli import main, runner
from stratoflow.config import clusters, locations
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import RunPlan, resolve_plan
from stratoflow.config.strategies import STRATEGIES
from stratoflow.services import airflow_setup
from stratoflow.tracking import model_serving


def test_list_shows_every_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["list"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "pipeline",
        "dataset",
        "model",
        "schedule",
        "registered_model",
        "dag_ids",
    ]
    mnist = next(line for line in lines if line.startswith("mnist "))
    for expected in (
        "stratoflow_mnist5k 1.0.0",
        "small_cnn",
        "0 3 * * 1",
        "stratoflow-mnist",
        "retrain_mnist,benchmark_strategies_mnist,refresh_stratoflow_mnist5k",
    ):
        assert expected in mnist
    diabetes = next(line for line in lines if line.startswith("diabetes "))
    assert diabetes.endswith(" retrain_diabetes,refresh_stratoflow_diabetes")  # regression
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
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(locations.PROJECT_ROOT / "dags")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert int(env["AIRFLOW__CORE__PARALLELISM"]) <= 4
    assert env["STRATOFLOW_HOME"] == str(locations.state_dir())
    assert env["MLFLOW_TRACKING_URI"] == locations.tracking_uri()
    assert env["TFDS_DATA_DIR"] == str(locations.data_dir())
    assert env["PYTHONPATH"].split(":") == [str(locations.PROJECT_ROOT), "/x"]


def test_the_runner_home_is_inside_the_state_dir() -> None:
    assert airflow_setup.airflow_home() == locations.state_dir() / "airflow"


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
        # Where training runs is the deployment's: a run names a configured cluster, never an
        # address (none is configured in these tests: see `no_deployment_clusters`).
        (
            {"strategy": "parameter_server", "cluster": '{"worker": ["w:1"], "ps": ["p:1"]}'},
            'Invalid input for param cluster: \'{"worker": ["w:1"], "ps": ["p:1"]}\' is '
            "not one of [None, '']",
        ),
        (
            {"launcher": "ray", "ray_cluster": "ray://127.0.0.1:10001"},
            "Invalid input for param ray_cluster: 'ray://127.0.0.1:10001' is not one of [None, '']",
        ),
        (
            {"launcher": "ray", "ray_cluster": "x" * 1_000_000},
            "Invalid input for param ray_cluster",
        ),
        ({"launcher": "ray", "ray_cluster": "$(curl evil)"}, "Invalid input for param ray_cluster"),
        (
            {"launcher": "ray", "ray_address": "ray://127.0.0.1:10001"},
            "run conf: unknown key 'ray_address' (renamed: ray_cluster, the name of a Ray cluster",
        ),
        (
            {"launcher": "slurm"},
            "Invalid input for param launcher: 'slurm' is not one of ['local', 'ray']",
        ),
        ({"max_restarts": -1}, "Invalid input for param max_restarts: -1 is less than the minimum"),
        ({"max_restarts": 11}, "Invalid input for param max_restarts: 11 is greater than the max"),
        ({"placement": "anywhere"}, "Invalid input for param placement: 'anywhere' is not one of"),
    ],
)
def test_check_conf_refuses_what_airflow_or_the_first_task_would(
    conf: dict[str, Any], message: str, no_deployment_clusters: None
) -> None:
    with pytest.raises(SpecError) as error:
        runner.check_conf("mnist", conf)
    assert message in str(error.value)


def test_check_conf_refuses_central_storage_for_a_model_with_dropout() -> None:
    with pytest.raises(SpecError, match="'central_storage' cannot train model 'mlp'"):
        runner.check_conf("digits", {"strategy": "central_storage"})


def test_check_conf_accepts_a_valid_conf() -> None:
    runner.check_conf("mnist", {"strategy": "mirrored", "replicas": 2, "loop": "fit"})


@pytest.fixture
def no_deployment_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment with no Ray and no standing clusters (whatever the test host's variables)."""
    for variable in (
        clusters.RAY_CLUSTERS_ENV,
        clusters.RAY_ADDRESS_ENV,
        clusters.STANDING_CLUSTERS_ENV,
        clusters.STANDING_CLUSTER_ENV,
    ):
        monkeypatch.delenv(variable, raising=False)


STANDING = '{"worker": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223"]}'


@pytest.mark.parametrize("cluster", [None, "", "omitted"])
def test_no_standing_cluster_is_null_empty_or_omitted(
    cluster: str | None, monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    # The UI's trigger form sends the Param's default, null; the CLI and REST may send "".
    conf = {"strategy": "parameter_server"} | ({} if cluster == "omitted" else {"cluster": cluster})
    runner.check_conf("mnist", conf)
    assert resolve_plan("mnist", conf).spec.training.cluster == ""
    # The deployment's cluster `default` serves a run that names none, by name.
    monkeypatch.setenv(clusters.STANDING_CLUSTER_ENV, STANDING)
    assert resolve_plan("mnist", conf).spec.training.cluster == "default"
    assert clusters.standing_cluster("default") == json.loads(STANDING)


def test_a_run_picks_a_standing_cluster_by_its_name(
    monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    monkeypatch.setenv(clusters.STANDING_CLUSTERS_ENV, json.dumps({"rack-2": json.loads(STANDING)}))
    conf = {"strategy": "parameter_server", "cluster": "rack-2"}
    assert resolve_plan("mnist", conf).spec.training.cluster == "rack-2"
    with pytest.raises(
        SpecError, match=r"param cluster: 'rack-3' is not one of \[None, '', 'rack-2'\]"
    ):
        runner.check_conf("mnist", {"strategy": "parameter_server", "cluster": "rack-3"})


@pytest.mark.parametrize("name", [None, "", "omitted"])
def test_launcher_ray_uses_the_deployments_default_cluster(
    name: str | None, monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    conf = {"launcher": "ray"} | ({} if name == "omitted" else {"ray_cluster": name})
    with pytest.raises(SpecError, match="launcher 'ray' needs a Ray cluster of this deployment"):
        runner.check_conf("mnist", conf)
    monkeypatch.setenv(clusters.RAY_ADDRESS_ENV, "ray-head:6379")  # the older single variable
    runner.check_conf("mnist", conf)
    assert resolve_plan("mnist", conf).spec.training.ray_cluster == "default"
    assert clusters.ray_address("default") == "ray-head:6379"


def test_launcher_ray_picks_a_configured_cluster_by_name_only(
    monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    monkeypatch.setenv(
        clusters.RAY_CLUSTERS_ENV, json.dumps({"east": "10.0.0.1:6379", "west": "ray://w:10001"})
    )
    named = resolve_plan("mnist", {"launcher": "ray", "ray_cluster": "west"}).spec
    assert named.training.ray_cluster == "west"
    assert clusters.ray_address("west") == "ray://w:10001"
    # No cluster 'default': a run must name one, and the error lists them.
    with pytest.raises(SpecError, match="it has no cluster 'default'; name one of: east, west"):
        runner.check_conf("mnist", {"launcher": "ray"})
    with pytest.raises(SpecError, match="ray_cluster 'north' is not a cluster of this deployment"):
        clusters.ray_address("north")


def test_a_standing_cluster_is_not_used_by_launcher_ray(
    monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    monkeypatch.setenv(clusters.STANDING_CLUSTER_ENV, STANDING)
    monkeypatch.setenv(clusters.RAY_ADDRESS_ENV, "head:6379")
    conf = {"strategy": "parameter_server", "launcher": "ray"}
    resolved = resolve_plan("mnist", conf).spec.training
    assert (resolved.cluster, resolved.ray_cluster) == ("", "default")
    with pytest.raises(SpecError, match="cannot be combined with launcher 'ray'"):
        runner.check_conf("mnist", conf | {"cluster": "default"})
    with pytest.raises(SpecError, match="ray_cluster applies to launcher 'ray' only"):
        runner.check_conf("mnist", {"ray_cluster": "default"})


def test_warm_spares_go_with_either_launcher(
    monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    monkeypatch.setenv(clusters.RAY_ADDRESS_ENV, "head:6379")
    for launcher in ("local", "ray"):
        conf = {"launcher": launcher, "warm_spares": True}
        runner.check_conf("mnist", conf)
        assert resolve_plan("mnist", conf).training.warm_spares


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (clusters.RAY_CLUSTERS_ENV, "head:6379", "$STRATOFLOW_RAY_CLUSTERS is not valid JSON"),
        # A list holds names (addresses in Airflow Connections): an address there is no name.
        (clusters.RAY_CLUSTERS_ENV, '["head:6379"]', "cluster name 'head:6379' must be"),
        (clusters.RAY_CLUSTERS_ENV, '"head:6379"', "must be a JSON object"),
        (clusters.RAY_CLUSTERS_ENV, '{"a b": "h:1"}', "cluster name 'a b' must be"),
        (clusters.RAY_CLUSTERS_ENV, '{"a": "h; rm -rf /"}', "cluster 'a' has address"),
        (clusters.STANDING_CLUSTERS_ENV, '{"a": {"worker": ["w:1"]}}', "cluster 'a' must be a"),
    ],
)
def test_a_malformed_cluster_configuration_names_its_variable(
    variable: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    no_deployment_clusters: None,
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(clusters.ClusterConfigError) as error:
        clusters.ray_clusters() if "RAY" in variable else clusters.standing_clusters()
    assert message in str(error.value)


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


def _event(text: str, level: str = "info") -> str:
    """A line as Airflow's console log renderer writes it (the real output: test_own_pipelines)."""
    return f"2026-12-06T02:21:38.819542Z [{level:<9}] {text} [task] loc=task_runner.py:1639\n"


def _traceback_of(call: Any) -> list[str]:
    import traceback

    try:
        call()
    except Exception as error:
        return "".join(traceback.format_exception(error)).splitlines(keepends=True)
    raise AssertionError("did not raise")


def test_the_failure_reader_keeps_each_tasks_last_error_as_the_task_raised_it() -> None:
    from stratoflow.cli.task_failures import TaskFailureReader
    from stratoflow.dags.refusals import no_retry_on_refusal
    from stratoflow.distributed.launcher import ChildProcessFailed

    @no_retry_on_refusal
    def refused() -> None:
        raise SpecError("/p/pipeline.yaml: model.builder 'model:build' raised RuntimeError: boom")

    def crashed(try_number: int) -> None:
        log_tail = "\n".join(f"  member line {n}" for n in range(1, 31))
        try:
            raise OSError("pipe closed")
        except OSError:
            raise ChildProcessFailed(  # noqa: B904 (printed after the OSError: the context)
                f"chief (pid 7) exited with code -6 (try {try_number}). Last 30 lines of its "
                f"log:\n{log_tail}"
            )

    def mapped() -> None:
        raise ValueError("strategy 'tpu' cannot run here")

    reader = TaskFailureReader()
    output = [
        _event("[DAG TEST] starting task_id=prepare_dataset map_index=-1"),
        _event("Task failed with exception", "error"),
        *_traceback_of(refused),
        _event("[DAG TEST] end task task_id=prepare_dataset map_index=-1"),
        _event("[DAG TEST] starting task_id=train_strategy map_index=2"),
        _event("Task failed with exception", "error"),
        *_traceback_of(mapped),
    ]
    for try_number in (1, 2):
        output += [
            _event("[DAG TEST] starting task_id=train_model map_index=-1"),
            "print() output of the task\n",
            _event("Task failed with exception", "error"),
            *_traceback_of(lambda try_number=try_number: crashed(try_number)),
        ]  # the output ends inside the last traceback
    for line in output:
        reader.take_line(line)
    reader.finish()

    assert reader.failures["prepare_dataset"].describe() == (
        "prepare_dataset failed: SpecError: /p/pipeline.yaml: model.builder 'model:build' "
        "raised RuntimeError: boom"
    )
    assert reader.failures["train_strategy[2]"].describe() == (
        "train_strategy[2] failed: ValueError: strategy 'tpu' cannot run here"
    )
    described = reader.failures["train_model"].describe().splitlines()
    assert described[0] == (
        "train_model failed: ChildProcessFailed: chief (pid 7) exited with code -6 (try 2). "
        "Last 30 lines of its log:"
    )
    assert described[1:] == [
        "  (20 lines omitted)",
        *(f"  member line {n}" for n in range(21, 31)),
    ]


def test_serve_model_fails_fast_when_mlflow_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracking server that does not answer: refused in seconds (MLflow's client would retry
    for minutes), naming the URI; no scoring server is started."""
    import socket

    with socket.socket() as unused:  # a loopback port nothing listens on
        unused.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{unused.getsockname()[1]}"
    monkeypatch.setenv(locations.TRACKING_URI_ENV, uri)
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
    monkeypatch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{store}")
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
    assert f"not a run of pipeline digits in {locations.tracking_uri()}: {'0' * 32}" in caplog.text


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

    assert main.main(["new-pipeline", "mine", "--from", example, "--dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"export STRATOFLOW_PIPELINES_PATH={tmp_path}" in printed
    assert "stratoflow run mine" in printed
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path))
    assert "mine" in list_pipelines()
    spec = resolve_plan("mine", {}).spec
    assert spec.registered_model == "mine"
    assert spec.folder == str(tmp_path / "mine")
    # Its own code and data are checked in (TensorFlow):
    # tests/unit/stratoflow/training/test_own_code_check.py.
    # Written once: a second time is refused.
    assert main.main(["new-pipeline", "mine", "--dir", str(tmp_path)]) == 1
    assert "exists already; choose another name or --dir" in caplog.text


def test_new_pipeline_refuses_a_name_that_cannot_be_a_pipeline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert main.main(["new-pipeline", "my-model", "--dir", str(tmp_path)]) == 1
    assert "pipeline name 'my-model' is not valid" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_a_malformed_cluster_configuration_naming_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_deployment_clusters: None
) -> None:
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, "head:6379")
    assert main.main(["list"]) == 2
    assert "$STRATOFLOW_RAY_CLUSTERS is not valid JSON" in caplog.text


def test_a_resolved_run_rebuilds_where_the_cluster_list_is_not_held(
    monkeypatch: pytest.MonkeyPatch, no_deployment_clusters: None
) -> None:
    """The first task checks the name against the deployment; a training member (the pipeline
    environment, or a Ray host) rebuilds the resolved plan without the cluster list."""
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"east": "10.0.0.1:6379"}))
    resolved = resolve_plan("mnist", {"launcher": "ray", "ray_cluster": "east"})
    monkeypatch.delenv(clusters.RAY_CLUSTERS_ENV)
    rebuilt = RunPlan.from_json(resolved.to_json(), "the payload")
    assert rebuilt == resolved
    assert rebuilt.training.ray_cluster == "east"
    with pytest.raises(SpecError, match=r"param ray_cluster: 'east' is not one of \[None, ''\]"):
        resolve_plan("mnist", {"launcher": "ray", "ray_cluster": "east"})


def test_accept_drift_is_a_flag_that_turns_it_on_for_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    confs: list[dict[str, object]] = []
    monkeypatch.setattr(runner, "run_pipeline", lambda pipeline, conf: confs.append(conf) or 0)

    assert main.main(["run", "penguins", "--accept-drift", "--no-promote"]) == 0
    assert main.main(["run", "penguins"]) == 0

    assert confs[0] == {"accept_drift": True, "promote": False}
    assert "accept_drift" not in confs[1]


def test_a_setting_off_by_default_gets_a_plain_flag_one_on_by_default_a_no_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_pipeline", lambda _, conf: given.append(conf) or 0)

    assert main.main(["run", "digits", "--force", "--no-promote"]) == 0
    assert main.main(["run", "digits"]) == 0

    assert given[0]["force"] is True and given[0]["promote"] is False
    assert "force" not in given[1] and "promote" not in given[1]
