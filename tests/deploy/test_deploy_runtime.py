"""The docker-compose deployment's scripts and settings, run for real outside Docker.

No Docker engine runs here, so the containers' commands run as local processes instead, with the
environment and flags read from `docker-compose.yml` (secrets filled in, container hosts and
ports replaced by local ones): the PostgreSQL init script on a throwaway PostgreSQL cluster
(whichever server version is installed, found as the services stack and the Makefile find it),
`airflow-init` migrating the `airflow` database as the `airflow` role, the api-server's login,
and the MLflow server on the `mlflow` database with its host check and proxied artifacts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratoflow.services.errors import ServiceError
from stratoflow.services.postgres import postgres_bin
from tests.deploy.test_compose import (
    AIRFLOW_INIT,
    API_SERVER,
    COMPOSE_FILE,
    MLFLOW,
    ROOT,
    SCHEDULER,
    VARIABLE,
    env_example,
    env_of,
)
from tests.support.processes import running

pytestmark = pytest.mark.integration

INIT_DATABASES = ROOT / "deploy" / "postgres" / "init-databases.sh"
AIRFLOW_INIT_SCRIPT = ROOT / "deploy" / "airflow-init.sh"
MLFLOW_SERVER_SCRIPT = ROOT / "deploy" / "mlflow-server.sh"
BIN = Path(sys.executable).parent
# What a user's .env would hold (hex, like `openssl rand -hex`), and a valid Fernet key.
SECRETS = {name: os.urandom(16).hex() for name in env_example()} | {
    "AIRFLOW_ADMIN_USERNAME": "admin",
    "AIRFLOW_FERNET_KEY": "Xv9dZyoC0NqIbbQ9a1v7qpsHBwl2XLSlcuqMNo3cQFg=",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def interpolate(value: str) -> str:
    """Compose's `${VAR...}` substitution, from SECRETS."""
    return VARIABLE.sub(lambda match: SECRETS[match.group(1)], value).replace("$$", "$")


def service_env(service: str, replace: Mapping[str, str]) -> dict[str, str]:
    """The compose environment of `service`, interpolated, with container addresses replaced."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    env = {}
    for key, value in env_of(compose["services"][service]).items():
        value = interpolate(value)
        for old, new in replace.items():
            value = value.replace(old, new)
        env[key] = value
    return env


def wait_http(url: str, timeout: float = 240, headers: Mapping[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {}))):
                return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def request(
    url: str,
    data: Any = None,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
        method=method,
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def pg_program(name: str) -> str:
    """A PostgreSQL program of the installed server (any version); a missing server fails."""
    try:
        return str(postgres_bin(name))
    except ServiceError as error:
        pytest.fail(f"{error} (`make system-packages`, which .ci/run calls, installs it)")


def run_as_postgres(args: list[str]) -> list[str]:
    # initdb and the server refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass
class Postgres:
    port: int
    socket_dir: Path

    def psql(self, user: str, database: str, sql: str, password: str | None = None):
        """Run `sql` over TCP as `user` (password auth, as the containers connect)."""
        return subprocess.run(
            [pg_program("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", user,
             "-d", database, "-v", "ON_ERROR_STOP=1", "-tAc", sql],
            env={**os.environ, "PGPASSWORD": password or "", "PGCONNECT_TIMEOUT": "10"},
            capture_output=True, text=True, check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster like the postgres image's: password auth over TCP."""
    root = Path(tempfile.mkdtemp(prefix="stratoflow-compose-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    password_file = root / "superuser-password"
    password_file.write_text(SECRETS["POSTGRES_PASSWORD"])
    password_file.chmod(0o644)
    subprocess.run(
        run_as_postgres([pg_program("initdb"), "-D", str(data), "-U", "postgres",
                         "--auth-local=trust", "--auth-host=scram-sha-256",
                         f"--pwfile={password_file}"]),
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets}"
    subprocess.run(
        run_as_postgres([pg_program("pg_ctl"), "-D", str(data), "-o", options,
                         "-l", str(root / "log"), "-w", "start"]),
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield Postgres(port, sockets)
    finally:
        subprocess.run(
            run_as_postgres([pg_program("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def databases(postgres: Postgres) -> Postgres:
    """The postgres container's init: deploy/postgres/init-databases.sh, as the superuser."""
    env = {
        **os.environ,
        **service_env("postgres", {}),
        "PGHOST": str(postgres.socket_dir),
        "PGPORT": str(postgres.port),
    }
    result = subprocess.run(
        ["bash", str(INIT_DATABASES)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"init-databases.sh failed:\n{result.stderr}"
    return postgres


def test_init_script_refuses_a_missing_password(postgres: Postgres) -> None:
    env = {**os.environ, "PGHOST": str(postgres.socket_dir), "PGPORT": str(postgres.port)}
    env.pop("MLFLOW_DB_PASSWORD", None)
    env["AIRFLOW_DB_PASSWORD"] = "x"
    result = subprocess.run(
        ["bash", str(INIT_DATABASES)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "MLFLOW_DB_PASSWORD is not set" in result.stderr


def test_each_database_belongs_to_its_own_role(databases: Postgres) -> None:
    for role in ("airflow", "mlflow"):
        password = SECRETS[f"{role.upper()}_DB_PASSWORD"]
        created = databases.psql(role, role, "CREATE TABLE probe (x int); SELECT 1", password)
        assert created.returncode == 0, f"{role} cannot use database {role}: {created.stderr}"
        other = "mlflow" if role == "airflow" else "airflow"
        refused = databases.psql(role, other, "SELECT 1", password)
        assert refused.returncode != 0 and "permission denied" in refused.stderr, (
            f"{role} can connect to database {other}: {refused.stdout}{refused.stderr}"
        )
        wrong = databases.psql(role, role, "SELECT 1", "not-the-password")
        assert "password authentication failed" in wrong.stderr


def test_airflow_init_and_api_server_login(databases: Postgres, tmp_path: Path) -> None:
    """airflow-init migrates the DB as `airflow` and creates the admin (FAB auth manager); the
    api-server started with the compose environment logs the admin in and refuses everyone
    else."""
    port = free_port()
    replace = {
        "@postgres:5432/": f"@127.0.0.1:{databases.port}/",
        "/opt/stratoflow/src/dags": str(ROOT / "dags"),
        "/opt/stratoflow/src/deploy/": f"{ROOT / 'deploy'}/",
        "/opt/stratoflow/": f"{tmp_path}/stratoflow/",
    }
    base = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    # The team's pipelines mount (`&team-pipelines`): an empty folder, as with no pipelines yet.
    (tmp_path / "stratoflow" / "pipelines").mkdir(parents=True)
    init = subprocess.run(
        ["bash", str(AIRFLOW_INIT_SCRIPT)],
        env={**base, **service_env(AIRFLOW_INIT, replace)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert init.returncode == 0, f"airflow-init failed:\n{init.stdout[-3000:]}{init.stderr[-3000:]}"
    assert "admin set" in init.stdout, init.stdout[-2000:]
    # What the dag-processor service does: parse the DAGs into the DB.
    parsed = subprocess.run(
        [str(BIN / "airflow"), "dags", "reserialize"],
        env={**base, **service_env("airflow-dag-processor", replace)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert parsed.returncode == 0, f"dags reserialize failed:\n{parsed.stderr[-3000:]}"

    with running(
        [str(BIN / "airflow"), "api-server", "--port", str(port), "--host", "127.0.0.1"],
        {**base, **service_env(API_SERVER, replace)},
        tmp_path / "api-server.log",
    ):
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/api/v2/monitor/health")
        status, _ = request(f"{url}/api/v2/dags")
        assert status == 401, f"anonymous GET /api/v2/dags answered {status}"
        status, _ = request(f"{url}/auth/token", {"username": "admin", "password": "wrong"})
        assert status == 401, f"a wrong password got {status}"
        status, body = request(
            f"{url}/auth/token",
            {"username": "admin", "password": SECRETS["AIRFLOW_ADMIN_PASSWORD"]},
        )
        assert status == 201, f"admin login answered {status}: {body[:300]!r}"
        token = json.loads(body)["access_token"]
        auth = {"Authorization": f"Bearer {token}"}
        status, body = request(f"{url}/api/v2/dags", headers=auth)
        assert status == 200, f"GET /api/v2/dags with the admin's token answered {status}"
        status, body = request(f"{url}/api/v2/importErrors", headers=auth)
        assert (status, json.loads(body)["total_entries"]) == (200, 0), body[:3000]
        # docs/tutorials/deploy.md, step 4: unpause, then trigger a parameter-server run.
        dag = f"{url}/api/v2/dags/retrain_digits"
        status, body = request(dag, {"is_paused": False}, auth, method="PATCH")
        assert status == 200 and json.loads(body)["is_paused"] is False, (status, body[:300])
        conf = {"strategy": "parameter_server", "epochs": 3}
        status, body = request(f"{dag}/dagRuns", {"logical_date": None, "conf": conf}, auth)
        assert status == 200, f"triggering retrain_digits answered {status}: {body[:300]!r}"
        assert json.loads(body)["conf"] == conf
        assert_password_guessing_is_limited(url)


def assert_password_guessing_is_limited(url: str) -> None:
    """The UI's login form answers 429 after a few tries from one address (FAB's limit), and so
    does `POST /auth/token` after a run of wrong passwords from one address for any usernames,
    even to the admin's right password then."""
    import httpx

    with httpx.Client(base_url=url, timeout=60) as browser:
        page = browser.get("/auth/login/").text
        (csrf,) = set(re.findall(r'name="csrf_token"[^>]*value="([^"]+)"', page))
        form = {"username": "admin", "password": "wrong", "csrf_token": csrf}
        ui = [browser.post("/auth/login/", data=form).status_code for _ in range(8)]
    assert 429 in ui and ui.index(429) >= 3, f"the UI login form answered {ui}"
    rest = []
    for attempt in range(60):
        status, _ = request(f"{url}/auth/token", {"username": f"guess{attempt}", "password": "x"})
        rest.append(status)
        if status != 401:
            break
    assert rest[-1] == 429 and len(rest) > 5, f"wrong logins for many users answered {rest}"
    status, _ = request(
        f"{url}/auth/token", {"username": "admin", "password": SECRETS["AIRFLOW_ADMIN_PASSWORD"]}
    )
    assert status == 429, f"the admin's login from the refused address answered {status}"


def test_mlflow_server_with_the_compose_flags(
    databases: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLflow service's entrypoint and command on the `mlflow` database: sign-in required
    (basic-auth, users in `mlflow_auth`), mlflow-init creates the tasks' account, Airflow's host
    name is accepted, an unknown one refused, and artifacts go through the server to its
    artifact folder."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())["services"][MLFLOW]
    port = free_port()
    artifacts = tmp_path / "artifacts"
    args = [
        arg.replace("5000", str(port)).replace("/opt/mlflow/artifacts", str(artifacts))
        for arg in compose["command"]
    ]
    replace = {
        "@postgres:5432/": f"@127.0.0.1:{databases.port}/",
        "/tmp/mlflow-auth/": f"{tmp_path}/mlflow-auth/",
    }
    env = service_env(MLFLOW, replace)
    server_env = {**os.environ, **env, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with running(["bash", str(MLFLOW_SERVER_SCRIPT), *args], server_env, tmp_path / "mlflow.log"):
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health")
        ini = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
        assert ini.stat().st_mode & 0o077 == 0, "the basic-auth config is readable by others"
        search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        status, _ = request(search, headers={"Host": f"mlflow:{port}"})
        assert status == 401, f"an anonymous search answered {status}"
        import base64

        admin = f"admin:{SECRETS['MLFLOW_ADMIN_PASSWORD']}".encode()
        basic = {"Authorization": "Basic " + base64.b64encode(admin).decode()}
        status, _ = request(search, headers={"Host": f"mlflow:{port}", **basic})
        assert status == 200, f"Host mlflow:{port} (Airflow's tasks) was refused: {status}"
        status, _ = request(search, headers={"Host": "attacker.example", **basic})
        assert status in (400, 403), f"an unknown Host header was accepted: {status}"
        # What mlflow-init does, then what a task does with the account it made.
        init_env = service_env("mlflow-init", {"http://mlflow:5000": url})
        init = subprocess.run(
            [sys.executable, "-m", "stratoflow.services.mlflow_auth", "service-account"],
            env={**os.environ, **init_env},
            capture_output=True,
            text=True,
            check=False,
        )
        assert init.returncode == 0, f"mlflow-init failed:\n{init.stderr[-3000:]}"
        # ... and claimed every pipeline's experiment and registered model for the account.
        from stratoflow.config import names
        from stratoflow.config.assets import loadable_specs

        for spec in loadable_specs():
            experiment = names.experiment_name(spec.name)
            status, body = request(
                f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name={experiment}",
                headers=basic,
            )
            assert status == 200, f"mlflow-init did not create {experiment}: {status} {body[:300]}"
            for kind, resource in (
                ("experiment", json.loads(body)["experiment"]["experiment_id"]),
                ("registered_model", spec.registered_model),
            ):
                status, body = request(
                    f"{url}/api/3.0/mlflow/users/permissions/get?username=stratoflow-airflow"
                    f"&resource_type={kind}&resource_id={resource}",
                    headers=basic,
                )
                assert (status, json.loads(body).get("permission")) == (200, "MANAGE"), (
                    f"{kind} {resource}: {status} {body[:300]}"
                )
        task_env = service_env(SCHEDULER, {})
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", task_env["MLFLOW_TRACKING_USERNAME"])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", task_env["MLFLOW_TRACKING_PASSWORD"])

        import mlflow

        client = mlflow.MlflowClient(tracking_uri=url)
        experiment = client.create_experiment("compose-probe")
        run = client.create_run(experiment)
        # The account created the experiment, so MLflow made it its manager.
        status, body = request(
            f"{url}/api/3.0/mlflow/users/permissions/get?username=stratoflow-airflow"
            f"&resource_type=experiment&resource_id={experiment}",
            headers=basic,
        )
        assert status == 200 and json.loads(body)["permission"] == "MANAGE", (status, body)
        (tmp_path / "note.txt").write_text("through the server")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
        assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
        stored = list(artifacts.rglob("note.txt"))
        assert stored and stored[0].read_text() == "through the server", (
            f"the artifact is not in --artifacts-destination {artifacts}"
        )
