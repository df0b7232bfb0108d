"""What a process that runs a pipeline's own code is handed: the allowlist of
`stratoflow.distributed.member_environment`, and the children both launchers start with it (real
child processes of the echo program, which writes down its environment)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stratoflow.distributed import launcher
from tests.support.processes import ECHO_MODULE
from tests.support.secret_sentinels import MLFLOW_ACCOUNT, SECRET_VARIABLES, leaked

NEEDED = {
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/home/worker",
    "USER": "worker",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp/worker",
    "PYTHONPATH": "/opt/stratoflow",
    "PYTHONHASHSEED": "0",
    "VIRTUAL_ENV": "/opt/venv",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_NUM_INTRAOP_THREADS": "4",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
    "OMP_NUM_THREADS": "4",
    "KMP_BLOCKTIME": "0",
    "CUDA_VISIBLE_DEVICES": "0",
    "GRPC_VERBOSITY": "ERROR",
    "TPU_NAME": "local",
    "TFDS_DATA_DIR": "/data/tfds",
    "STRATOFLOW_HOME": "/srv/stratoflow",
    "STRATOFLOW_PIPELINES_PATH": "/srv/team-pipelines",
    "HTTPS_PROXY": "http://proxy:3128",
    "NO_PROXY": "mlflow,127.0.0.1",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca.pem",
}
NOT_NEEDED = {
    **SECRET_VARIABLES,
    "AIRFLOW_HOME": "/opt/airflow",
    "AIRFLOW_CTX_DAG_ID": "retrain_digits",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://user:pw@db/warehouse",
    "AIRFLOW_VAR_API_KEY": "k",
    "RAY_ADDRESS": "ray-head:6379",
    "MLFLOW_BACKEND_STORE_URI": "postgresql://mlflow:pw@db/mlflow",
    # The training processes report to their task, which logs: nothing of MLflow's client.
    "MLFLOW_TRACKING_URI": "http://mlflow:5000",
    **MLFLOW_ACCOUNT,
    "MLFLOW_TRACKING_TOKEN": "a-token-of-the-service-account",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "2",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
    "STRATOFLOW_CLUSTER": '{"worker": ["w:1"], "ps": ["p:2"]}',
    "STRATOFLOW_RAY_ADDRESS": "ray-head:6379",
    # Terraform's credentials share TensorFlow's TF_ prefix.
    "TF_VAR_db_password": "pw",
    "TF_TOKEN_app_terraform_io": "t",
    "TF_HTTP_PASSWORD": "pw",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "SHELL": "/bin/bash",
}


def test_pipeline_code_gets_what_it_needs_and_nothing_of_airflows_rays_or_mlflows():
    from stratoflow.distributed.member_environment import pipeline_environment

    assert pipeline_environment({**NEEDED, **NOT_NEEDED}) == NEEDED


def test_a_team_passes_its_own_variables_by_the_prefix_which_is_removed():
    from stratoflow.distributed.member_environment import pipeline_environment

    environ = {
        **NEEDED,
        "STRATOFLOW_PIPELINE_ENV_WANDB_API_KEY": "team-key",
        # A team's value wins over the deployment's for pipeline code.
        "STRATOFLOW_PIPELINE_ENV_TF_NUM_INTRAOP_THREADS": "1",
    }
    environment = pipeline_environment(environ)
    assert environment["WANDB_API_KEY"] == "team-key"
    assert environment["TF_NUM_INTRAOP_THREADS"] == "1"
    assert not [name for name in environment if name.startswith("STRATOFLOW_PIPELINE_ENV_")]


@pytest.mark.parametrize(
    "name",
    [
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW_CONN_WAREHOUSE",
        "RAY_AUTH_TOKEN",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "STRATOFLOW_AIRFLOW_USER_PASSWORD",
        "",
    ],
)
def test_a_team_variable_named_like_the_deployments_own_is_refused_naming_it(name):
    from stratoflow.distributed.member_environment import (
        PipelineEnvironmentError,
        pipeline_environment,
    )

    variable = f"STRATOFLOW_PIPELINE_ENV_{name}"
    with pytest.raises(PipelineEnvironmentError) as refused:
        pipeline_environment({**NEEDED, variable: "copied"})
    message = str(refused.value)
    assert message.startswith(f"{variable}: "), message
    assert "copied" not in message  # the value may be a secret: never repeated


def test_what_the_ray_driver_forwards_to_its_members_is_all_allowed():
    from stratoflow.distributed.member_environment import pipeline_environment
    from stratoflow.distributed.ray_launcher import FORWARDED_ENV

    forwarded = {name: "x" for name in FORWARDED_ENV}
    assert pipeline_environment(forwarded) == forwarded
    assert not [name for name in FORWARDED_ENV if name.startswith("MLFLOW_")]


# --- the children the launchers start -------------------------------------------------------


@pytest.fixture
def deployment_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process holds the deployment's secrets, as an Airflow task process does."""
    for name, value in {**SECRET_VARIABLES, **MLFLOW_ACCOUNT}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STRATOFLOW_PIPELINE_ENV_TEAM_SETTING", "team-value")


def _assert_handed_only_what_it_needs(environ: dict[str, str]) -> None:
    assert leaked(environ) == [], f"a pipeline process was handed {leaked(environ)}"
    assert environ["TEAM_SETTING"] == "team-value"
    assert environ["PATH"]


@pytest.mark.integration
def test_a_local_launcher_child_is_handed_the_allowlisted_environment(
    deployment_environment, tmp_path: Path
) -> None:
    dump = tmp_path / "environ.json"
    member = launcher.Member("member", ECHO_MODULE, {"TF_CONFIG": '{"cluster": {}}'})
    launcher.run_cluster(lambda: [member], "member", {"environment_to": str(dump)})
    environ = json.loads(dump.read_text())
    _assert_handed_only_what_it_needs(environ)
    # What the launcher sets for the member comes on top.
    assert environ["TF_CONFIG"] == '{"cluster": {}}'
    assert environ[launcher.PROCESS_START_ENV]
    assert Path(environ["TMPDIR"]).name.startswith("stratoflow-child-")


@pytest.mark.integration
def test_a_ray_member_host_hands_its_child_the_allowlisted_environment(
    deployment_environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`MemberHost` as a plain object (no Ray): its process stands for a Ray worker on a node,
    whose environment holds the node's Ray token; the driver's variables come in `env`."""
    from stratoflow.distributed.ray_launcher import MemberHost

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets for a 1-CPU actor
    dump = tmp_path / "environ.json"
    host = MemberHost()
    try:
        host.start(
            ECHO_MODULE,
            json.dumps({"environment_to": str(dump)}),
            {"TF_CONFIG": '{"cluster": {}}', "TEAM_SETTING": "team-value"},
        )
        deadline = time.monotonic() + 60
        while (state := host.poll())["returncode"] is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state["returncode"] == 0, state
    finally:
        host.stop()
    environ = json.loads(dump.read_text())
    _assert_handed_only_what_it_needs(environ)
    assert environ["TF_CONFIG"] == '{"cluster": {}}'
    assert "OMP_NUM_THREADS" not in environ
