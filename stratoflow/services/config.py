"""What each component of the stack is given: its ports, secrets, environment and command line.

`environment()` is the single list of the variables a component gets: the local stack
(`stratoflow.services.stack`) and `docker-compose.yml` must agree on it, and a test holds them to
it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stratoflow.config import clusters, locations
from stratoflow.services import postgres

POSTGRES = "postgres"
MLFLOW = "mlflow"
API_SERVER = "airflow-api-server"
SCHEDULER = "airflow-scheduler"
DAG_PROCESSOR = "airflow-dag-processor"
TRIGGERER = "airflow-triggerer"
AIRFLOW_COMPONENTS = (API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER)
# Start order; `down` stops them in reverse.
COMPONENTS = (POSTGRES, MLFLOW, *AIRFLOW_COMPONENTS)
# A single-node Ray cluster for `launcher: ray` runs, started on request (`services up --ray`):
# an idle head costs about 675 MB (docs/BENCHMARKS.md, "Facts"). Stopped first by `down`.
RAY_HEAD = "ray-head"
RAY_CLIENT = "ray-client"

HOST = "127.0.0.1"
ADMIN_USER = "admin"
# Airflow's auth manager: FAB, with users and roles in the metadata DB (Admin, Op, Viewer...).
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
ADMIN_ROLE = "Admin"
# MLflow's basic-auth app: its admin, and the account the Airflow tasks log and register with.
MLFLOW_ADMIN_USER = "admin"
MLFLOW_SERVICE_USER = "stratoflow-airflow"
# Small on purpose: every task process imports TensorFlow (about half a GB) on a small host.
PARALLELISM = 2
# The Airflow plugins the api-server loads: stratoflow's limit on password guessing at
# `POST /auth/token` (stratoflow.services.login_limit). docker-compose.yml names the same folder.
AIRFLOW_PLUGINS_FOLDER = locations.PROJECT_ROOT / "deploy" / "airflow-plugins"
# What FAB's auth manager is told (the compose deployment sets the same): users are read from the
# metadata DB on every request (its user cache, `[fab] cache_ttl`, kept a deleted or deactivated
# user's token working for 30 s), and its UI login form takes 5 posts per 40 s from one address
# (FAB's default, stated here so that it stays on).
FAB_SETTINGS = {
    "AIRFLOW__FAB__CACHE_TTL": "0",
    "AIRFLOW__FAB__AUTH_RATE_LIMITED": "True",
    "AIRFLOW__FAB__AUTH_RATE_LIMIT": "5 per 40 second",
}
# Task logs: Airflow creates their folders and files with these modes (its defaults, 0o775 and
# 0o664, are for impersonation); stratoflow.services.file_modes says why owner only.
TASK_LOG_MODES = {
    "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FOLDER_PERMISSIONS": "0o700",
    "AIRFLOW__LOGGING__FILE_TASK_HANDLER_NEW_FILE_PERMISSIONS": "0o600",
}
# database -> owning role; `mlflow_auth` is the user store of MLflow's basic-auth app.
DATABASES = {"airflow": "airflow", "mlflow": "mlflow", "mlflow_auth": "mlflow"}


def default_state_dir() -> Path:
    """Where `stratoflow services up` keeps its stack: `services/` in the stratoflow state dir."""
    return locations.state_dir() / "services"


def new_secrets() -> dict[str, str]:
    """Fresh passwords and keys for a new stack (kept in its `secrets.json`)."""
    return {
        "postgres_superuser_password": secrets.token_urlsafe(24),
        **{f"postgres_{role}_password": secrets.token_urlsafe(24) for role in DATABASES.values()},
        "airflow_admin_password": secrets.token_urlsafe(18),
        "jwt_secret": secrets.token_urlsafe(32),
        "api_secret_key": secrets.token_urlsafe(32),
        "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "mlflow_admin_password": secrets.token_urlsafe(18),
        "mlflow_service_password": secrets.token_urlsafe(18),
        "mlflow_secret_key": secrets.token_urlsafe(32),
        # Ray's token authentication (the head and the tasks that drive it); Ray's own format.
        "ray_auth_token": secrets.token_hex(32),
    }


@dataclass(frozen=True)
class StackConfig:
    """Where a stack lives, its ports and its generated secrets: everything `environment` needs.

    Attributes:
        state_dir: the stack's folder (PostgreSQL data, Airflow home, artifacts, logs).
        ports: component -> TCP port on 127.0.0.1 (postgres, mlflow, airflow-api-server).
        secrets: the generated passwords and keys (see `new_secrets`).
        data_dir: the TFDS data dir the tasks read and build datasets in.
    """

    state_dir: Path
    ports: Mapping[str, int]
    secrets: Mapping[str, str]
    data_dir: Path

    @property
    def airflow_home(self) -> Path:
        return self.state_dir / "airflow"

    @property
    def postgres_dir(self) -> Path:
        return self.state_dir / "postgres"

    @property
    def artifacts_dir(self) -> Path:
        return self.state_dir / "mlartifacts"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def mlflow_auth_config(self) -> Path:
        """The basic-auth app's ini: it names the user store with its password, so private."""
        return self.state_dir / "mlflow_auth.ini"

    @property
    def mlflow_uri(self) -> str:
        """The tracking URI users and tasks log to."""
        return f"http://{HOST}:{self.ports[MLFLOW]}"

    @property
    def api_url(self) -> str:
        """The Airflow API server: REST API v2 under `/api/v2`, tokens at `/auth/token`."""
        return f"http://{HOST}:{self.ports[API_SERVER]}"

    @property
    def ray_address(self) -> str:
        """The Ray head's GCS address, or "" when the stack runs no Ray head."""
        return f"{HOST}:{self.ports[RAY_HEAD]}" if RAY_HEAD in self.ports else ""

    @property
    def ray_private_dir(self) -> Path:
        """The folder (0700) that holds Ray's: Ray makes its own session folders 0777.

        Short (Ray's socket paths must fit 107 bytes), one per stack, and not Ray's default
        `/tmp/ray`, whose `ray_current_cluster` outlives `ray stop`.
        """
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"stratoflow-ray-{digest}"

    @property
    def ray_temp_dir(self) -> Path:
        """Ray's temp folder (`ray start --temp-dir`), where its session folders go."""
        return self.ray_private_dir / "ray"

    @property
    def admin_password(self) -> str:
        return self.secrets["airflow_admin_password"]

    @property
    def mlflow_admin_password(self) -> str:
        return self.secrets["mlflow_admin_password"]

    @property
    def mlflow_service_password(self) -> str:
        return self.secrets["mlflow_service_password"]

    def database_password(self, database: str) -> str:
        return self.secrets[f"postgres_{DATABASES[database]}_password"]

    def database_uri(self, database: str, driver: str = "postgresql+psycopg2") -> str:
        role, password = DATABASES[database], self.database_password(database)
        return f"{driver}://{role}:{password}@{HOST}:{self.ports[POSTGRES]}/{database}"


def environment(component: str, config: StackConfig) -> dict[str, str]:
    """The environment variables component `component` gets (on top of the inherited ones).

    This is the one list of them: the services here and a compose file must agree on it.

    Args:
        component: one of `COMPONENTS`.
        config: the stack's ports, secrets and folders.

    Returns:
        Variable name -> value.
    """
    if component == POSTGRES:
        return dict(postgres.SERVER_ENVIRONMENT)
    if component == RAY_HEAD:
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": config.secrets["ray_auth_token"],
            # With --node-ip-address=127.0.0.1, every Ray server of this single node binds
            # loopback only (Ray then refuses other nodes, which a local stack has none of).
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    if component == MLFLOW:
        return {
            "MLFLOW_BACKEND_STORE_URI": config.database_uri("mlflow"),
            "MLFLOW_ARTIFACTS_DESTINATION": str(config.artifacts_dir),
            # Only loopback Host headers: no DNS rebinding onto this server.
            "MLFLOW_SERVER_ALLOWED_HOSTS": f"{HOST}:{config.ports[MLFLOW]},"
            f"localhost:{config.ports[MLFLOW]}",
            # The job runner alone costs about 1 GB (docs/BENCHMARKS.md, "Facts"), and stratoflow
            # uses no MLflow jobs.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            # basic-auth (stratoflow.services.mlflow_auth): the ini and the user store it names,
            # the admin created on the first start, and the key signing its CSRF tokens.
            "MLFLOW_AUTH_CONFIG_PATH": str(config.mlflow_auth_config),
            "MLFLOW_AUTH_DATABASE_URI": config.database_uri("mlflow_auth"),
            "MLFLOW_AUTH_ADMIN_USERNAME": MLFLOW_ADMIN_USER,
            "MLFLOW_AUTH_ADMIN_PASSWORD": config.mlflow_admin_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": config.secrets["mlflow_secret_key"],
        }
    if component not in AIRFLOW_COMPONENTS:
        raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")

    return {
        "AIRFLOW_HOME": str(config.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(locations.DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(PARALLELISM),
        "AIRFLOW__CORE__FERNET_KEY": config.secrets["fernet_key"],
        # Tasks report to the API server's execution API, authenticated with JWTs that the
        # scheduler signs and the API server checks: both need the same secret.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.api_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": config.secrets["jwt_secret"],
        # Users and roles in the metadata DB; `stratoflow.services.airflow_users` adds them.
        "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": config.database_uri("airflow"),
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(config.ports[API_SERVER]),
        "AIRFLOW__API__BASE_URL": config.api_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": config.secrets["api_secret_key"],
        "AIRFLOW__API__EXPOSE_CONFIG": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(AIRFLOW_PLUGINS_FOLDER),
        **FAB_SETTINGS,
        **TASK_LOG_MODES,
        # The tasks' stores: the stack's MLflow server, datasets and run folders.
        locations.STATE_DIR_ENV: str(config.state_dir),
        locations.TRACKING_URI_ENV: config.mlflow_uri,
        # The tasks' MLflow account, read by MLflow's client from the environment.
        "MLFLOW_TRACKING_USERNAME": MLFLOW_SERVICE_USER,
        "MLFLOW_TRACKING_PASSWORD": config.mlflow_service_password,
        locations.DATA_DIR_ENV: str(config.data_dir),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PYTHONPATH": str(locations.PROJECT_ROOT),
        # `launcher: ray` runs drive the stack's Ray head as the deployment's Ray cluster
        # `default`, if it runs one ("" otherwise: such a run is refused, naming ray_cluster),
        # with its token. The DAG processor reads it too: the Params list the cluster names.
        clusters.RAY_ADDRESS_ENV: config.ray_address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": config.secrets["ray_auth_token"],
    }


def environment_names(component: str) -> list[str]:
    """The names of the variables `environment` sets for `component` (a compose file's too)."""
    placeholder = StackConfig(
        state_dir=Path("/srv/stratoflow"),
        ports={POSTGRES: 5432, MLFLOW: 5000, API_SERVER: 8080},
        secrets=dict.fromkeys(new_secrets(), "placeholder"),
        data_dir=Path("/srv/stratoflow/tensorflow_datasets"),
    )
    return sorted(environment(component, placeholder))


def command(component: str, config: StackConfig) -> list[str]:
    """The command line of a long-running component (secrets travel in `environment`)."""
    if component == POSTGRES:
        return postgres.server_command(config.postgres_dir, HOST, config.ports[POSTGRES])
    if component == MLFLOW:
        return [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            HOST,
            "--port",
            str(config.ports[MLFLOW]),
            "--workers",
            "1",
            "--serve-artifacts",
            "--app-name",
            "basic-auth",
        ]
    if component == RAY_HEAD:
        return [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={HOST}",
            f"--port={config.ports[RAY_HEAD]}",
            f"--ray-client-server-port={config.ports[RAY_CLIENT]}",
            f"--num-cpus={os.cpu_count() or 1}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={config.ray_temp_dir}",
        ]
    airflow = [sys.executable, "-m", "airflow"]
    if component == API_SERVER:
        return [*airflow, "api-server", "--host", HOST, "--port", str(config.ports[API_SERVER])]
    if component == SCHEDULER:
        # Tasks run on this host and write their logs where the API server reads them.
        return [*airflow, "scheduler", "--skip-serve-logs"]
    if component == DAG_PROCESSOR:
        return [*airflow, "dag-processor"]
    if component == TRIGGERER:
        return [*airflow, "triggerer", "--skip-serve-logs"]
    raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
