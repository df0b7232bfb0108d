"""What each service component is given (environment, command line) and the light helpers around
the stack; the live stack itself is tested in `tests/integration/services/`."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratoflow import services
from stratoflow.config import assets, locations, names
from stratoflow.services import config as stack_config
from stratoflow.services import postgres
from stratoflow.services.config import (
    AIRFLOW_COMPONENTS,
    API_SERVER,
    COMPONENTS,
    MLFLOW,
    POSTGRES,
    RAY_HEAD,
    StackConfig,
)
from stratoflow.tracking import mlflow_runs


@pytest.fixture
def config(tmp_path: Path) -> StackConfig:
    return StackConfig(
        state_dir=tmp_path,
        ports={POSTGRES: 15432, MLFLOW: 15000, API_SERVER: 18080},
        secrets=stack_config.new_secrets(),
        data_dir=tmp_path / "tfds",
    )


def test_airflow_components_share_one_configuration(config: StackConfig) -> None:
    environments = [stack_config.environment(c, config) for c in AIRFLOW_COMPONENTS]
    assert all(env == environments[0] for env in environments)
    env = environments[0]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == config.secrets["jwt_secret"]
    assert env["AIRFLOW__CORE__AUTH_MANAGER"] == stack_config.FAB_AUTH_MANAGER
    # The tasks sign in to MLflow as the service account, with its generated password.
    assert env["MLFLOW_TRACKING_USERNAME"] == stack_config.MLFLOW_SERVICE_USER
    assert env["MLFLOW_TRACKING_PASSWORD"] == config.secrets["mlflow_service_password"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@127.0.0.1:15432/airflow")
    assert 2 <= int(env["AIRFLOW__CORE__PARALLELISM"]) <= 4
    # The tasks log to the stack's MLflow server and keep runs in the stack's folder.
    assert env[locations.TRACKING_URI_ENV] == "http://127.0.0.1:15000"
    assert env[locations.STATE_DIR_ENV] == str(config.state_dir)


def test_mlflow_uses_its_own_database_and_serves_artifacts(config: StackConfig) -> None:
    env = stack_config.environment(MLFLOW, config)
    uri = env["MLFLOW_BACKEND_STORE_URI"]
    # Its own role and password: Airflow's credentials cannot touch MLflow's data.
    password = config.secrets["postgres_mlflow_password"]
    assert uri == f"postgresql+psycopg2://mlflow:{password}@127.0.0.1:15432/mlflow"
    assert password != config.secrets["postgres_airflow_password"]
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert env["MLFLOW_SERVER_ALLOWED_HOSTS"] == "127.0.0.1:15000,localhost:15000"
    assert "--serve-artifacts" in stack_config.command(MLFLOW, config)


def test_mlflow_requires_login_with_its_user_store_beside_the_tracking_data(
    config: StackConfig,
) -> None:
    from stratoflow.services.mlflow_auth import auth_config

    command = stack_config.command(MLFLOW, config)
    assert command[command.index("--app-name") + 1] == "basic-auth"
    env = stack_config.environment(MLFLOW, config)
    password = config.secrets["postgres_mlflow_password"]
    store = f"postgresql+psycopg2://mlflow:{password}@127.0.0.1:15432/mlflow_auth"
    assert env["MLFLOW_AUTH_DATABASE_URI"] == store
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == config.secrets["mlflow_admin_password"]
    ini = auth_config(store)
    assert "default_permission = READ" in ini and f"database_uri = {store}" in ini
    # Generated, and different from each other: the tasks' account is not the admin.
    assert config.secrets["mlflow_service_password"] != config.secrets["mlflow_admin_password"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_command_lines_bind_loopback_and_carry_no_secret(
    config: StackConfig, component: str
) -> None:
    line = " ".join(stack_config.command(component, config))
    assert not any(secret in line for secret in config.secrets.values())  # `ps` shows argv
    if component in (POSTGRES, MLFLOW, API_SERVER):
        assert "127.0.0.1" in line and str(config.ports[component]) in line
        assert "0.0.0.0" not in line


def test_environment_names_list_what_each_component_gets() -> None:
    airflow = stack_config.environment_names(API_SERVER)
    assert "AIRFLOW__API_AUTH__JWT_SECRET" in airflow and locations.TRACKING_URI_ENV in airflow
    assert all(stack_config.environment_names(c) == airflow for c in AIRFLOW_COMPONENTS)
    assert "MLFLOW_BACKEND_STORE_URI" in stack_config.environment_names(MLFLOW)


def test_unknown_component_is_refused_naming_the_known_ones(config: StackConfig) -> None:
    with pytest.raises(ValueError, match="airflow-scheduler"):
        stack_config.environment("airflow-webserver", config)


def test_generated_secrets_differ_each_time() -> None:
    first, second = stack_config.new_secrets(), stack_config.new_secrets()
    assert first.keys() == second.keys()
    assert not set(first.values()) & set(second.values())


def test_postgres_server_programs_are_found() -> None:
    assert postgres.postgres_bin("initdb").is_file()
    assert postgres.postgres_bin("pg_ctl").is_file()


def test_dataset_assets_are_named_after_the_tfds_dataset() -> None:
    assert names.asset_uri("stratoflow_digits") == "x-tfds://stratoflow_digits"
    assert assets.dataset_asset("stratoflow_digits").name == "stratoflow_digits"
    assert names.refresh_dag_id("stratoflow_digits") == "refresh_stratoflow_digits"
    assert sorted(assets.datasets_in_use()) == [
        "stratoflow_diabetes",
        "stratoflow_digits",
        "stratoflow_mnist5k",
        "stratoflow_penguins",
    ]
    assert assets.pipelines_reading("stratoflow_mnist5k") == ["mnist"]


# ----- MLflow reachability ---------------------------------------------------------------------


@pytest.fixture
def health_server() -> Iterator[str]:
    """A real HTTP server answering `/health` with 200, as an MLflow server does."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_tracking_server_that_answers_passes_the_check(health_server: str) -> None:
    mlflow_runs.check_reachable(health_server)


def test_a_dead_tracking_server_fails_fast_naming_the_uri() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(mlflow_runs.TrackingUnavailableError) as error:
        mlflow_runs.check_reachable(uri, attempts=2)
    assert f"MLflow at {uri} is unreachable" in str(error.value)
    assert "MLFLOW_TRACKING_URI" in str(error.value)
    # Not a speed target: MLflow's own client would sit in its retry loop for minutes.
    assert time.monotonic() - started < 30


# ----- Airflow API client ----------------------------------------------------------------------


class AirflowLike(http.server.BaseHTTPRequestHandler):
    """Gives tokens, and answers every other call with the next status of `answers`."""

    answers: list[int] = []
    calls = 0

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        if self.path == "/auth/token":
            self._answer(201, b'{"access_token": "t"}')
        else:
            self._next_answer()

    def do_PATCH(self) -> None:  # noqa: N802
        self._next_answer()

    def _next_answer(self) -> None:
        type(self).calls += 1
        status = self.answers.pop(0)
        self._answer(status, b'{"detail": {"reason": "Database error"}}' if status == 500 else b"")

    def _answer(self, status: int, body: bytes) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("call", "answers", "calls", "fails"),
    [
        ("set_run_state", [500, 200], 2, False),
        ("set_run_state", [500, 500, 500], 3, True),
        ("set_run_state", [409], 1, True),
        ("trigger", [500], 1, True),
    ],
    ids=[
        "one-database-error-then-set",
        "database-errors-each-time",
        "a-conflict-is-not-retried",
        "a-trigger-is-not-repeated",
    ],
)
def test_a_repeatable_call_tries_again_only_after_a_database_error(
    call: str, answers: list[int], calls: int, fails: bool
) -> None:
    from stratoflow.services.airflow_api import AirflowApi, AirflowApiError

    handler = type("Handler", (AirflowLike,), {"answers": list(answers), "calls": 0})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = AirflowApi(f"http://127.0.0.1:{server.server_address[1]}", "admin", "secret")

    def make_the_call() -> None:
        if call == "trigger":  # a POST: a second one could create a second run
            api.trigger("retrain_digits", {"epochs": 1})
        else:
            api.set_run_state("retrain_digits", "scheduled__x", "failed")

    try:
        if fails:
            with pytest.raises(AirflowApiError) as error:
                make_the_call()
            assert error.value.status_code == answers[-1]
        else:
            make_the_call()
        assert handler.calls == calls
    finally:
        server.shutdown()


def test_local_stores_are_not_probed(tmp_path: Path) -> None:
    mlflow_runs.check_reachable(f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}")


@pytest.mark.integration
def test_a_component_not_healthy_in_time_fails_naming_it_and_quoting_its_log(
    tmp_path: Path,
) -> None:
    """MLflow against a PostgreSQL port nobody listens on never gets healthy."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    stack = services.Stack(tmp_path / "stack", attached=True)
    stack.config = StackConfig(
        state_dir=stack.state_dir,
        ports={POSTGRES: closed_port, MLFLOW: closed_port + 1, API_SERVER: closed_port + 2},
        secrets=stack_config.new_secrets(),
        data_dir=tmp_path / "tfds",
    )
    try:
        stack.start_component(MLFLOW)
        with pytest.raises(services.ServiceError) as error:
            stack.wait_healthy(MLFLOW, time.monotonic() + 5)
    finally:
        stack.down()
    message = str(error.value)
    assert message.startswith("mlflow was not healthy in time (ConnectError")
    assert f"Last lines of {stack.config.logs_dir / 'mlflow.log'}:" in message
    assert stack.running() == []


def test_a_stack_process_is_still_recognised_after_a_wall_clock_step() -> None:
    """`status` and `down` run in other processes than `up`: they know a component by its record.

    A clock step (NTP, a resumed laptop or VM) moves psutil's wall-clock `create_time` of every
    process; the record's start after boot does not move, so the server is still found running,
    and a later process reusing the PID is still told apart.
    """
    import subprocess
    import sys

    from stratoflow.distributed.processes import ManagedProcess

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = ManagedProcess.started(server).to_dict()
        assert record["seconds_after_boot"] is not None  # Linux, as on the test hosts
        stepped = {**record, "create_time": record["create_time"] - 30.0}  # the clock went 30 s on
        assert ManagedProcess.from_dict(stepped).is_alive()
        reused = {**record, "seconds_after_boot": record["seconds_after_boot"] - 5.0}
        assert not ManagedProcess.from_dict(reused).is_alive()
        # A record written before `seconds_after_boot` existed is checked by the wall clock.
        legacy = {"pid": record["pid"], "create_time": record["create_time"]}
        assert ManagedProcess.from_dict(legacy).is_alive()
        assert not ManagedProcess.from_dict({**legacy, "create_time": 0.0}).is_alive()
    finally:
        server.kill()
        server.wait()
    assert not ManagedProcess.from_dict(record).is_alive()


def test_rays_session_folders_lie_in_a_folder_only_the_stack_owner_may_enter(
    tmp_path: Path,
) -> None:
    """Ray makes its temp folder and session folders 0777 (no sticky bit): `up --ray` gives it a
    temp folder inside one that only the stack's owner may enter, made before Ray starts."""
    import shutil
    import stat

    stack = services.Stack(tmp_path / "state")
    config = stack._prepare_config(ray=True)
    try:
        (argument,) = [
            arg for arg in stack_config.command(RAY_HEAD, config) if arg.startswith("--temp-dir=")
        ]
        temp_dir = Path(argument.split("=", 1)[1])
        guards = [
            folder
            for folder in temp_dir.parents
            if folder.is_dir()
            and folder.stat().st_uid == os.geteuid()
            and not stat.S_IMODE(folder.stat().st_mode) & 0o077
        ]
        assert guards, f"Ray's --temp-dir {temp_dir} lies in no folder only its owner may enter"
    finally:  # the stack's own Ray folder, and nothing above it
        assert config.ray_private_dir.name.startswith("stratoflow-ray-")
        shutil.rmtree(config.ray_private_dir, ignore_errors=True)


def test_a_stack_with_ray_counts_the_ray_head_among_its_components(tmp_path: Path) -> None:
    """`services status` of a stack started with `--ray` says n/7, not n/6 ("7/6 running")."""
    import shutil

    from stratoflow.services.stack import describe

    stack = services.Stack(tmp_path / "state")
    stack.config = stack._prepare_config(ray=True)
    try:
        first_line = describe(stack).splitlines()[0]
        assert first_line.endswith(f": 0/{len(COMPONENTS) + 1} components running"), first_line
    finally:
        shutil.rmtree(stack.config.ray_private_dir, ignore_errors=True)
