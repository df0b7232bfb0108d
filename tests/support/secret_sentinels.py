"""The deployment's secrets as sentinel values, the check that a process was handed none, and a
probe module a test's pipeline calls to write down its process's environment.

The names are the ones the services stack and docker-compose give the scheduler (and so every
Airflow task process): Airflow's JWT secret, Fernet key, API secret key and metadata DB URL, the
Ray token, MLflow's server-side secrets and the password `stratoflow users add` reads, and the
tasks' MLflow service account. A process that runs a pipeline's own code must hold none of them
(docs/explanation/trust-model.md).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_TOKEN = os.urandom(6).hex()

SECRET_VARIABLES = {
    "AIRFLOW__API_AUTH__JWT_SECRET": f"sentinel-jwt-{_TOKEN}",
    # A valid key: Airflow may read it while the test's DAG runs.
    "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
    "AIRFLOW__API__SECRET_KEY": f"sentinel-api-key-{_TOKEN}",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
        f"postgresql+psycopg://airflow:sentinel-db-{_TOKEN}@127.0.0.1:9/airflow"
    ),
    "RAY_AUTH_TOKEN": f"sentinel-ray-{_TOKEN}",
    "RAY_AUTH_TOKEN_PATH": f"/nonexistent/sentinel-ray-path-{_TOKEN}",
    "MLFLOW_AUTH_ADMIN_PASSWORD": f"sentinel-mlflow-admin-{_TOKEN}",
    "MLFLOW_FLASK_SERVER_SECRET_KEY": f"sentinel-mlflow-flask-{_TOKEN}",
    "STRATOFLOW_AIRFLOW_USER_PASSWORD": f"sentinel-user-{_TOKEN}",
}
# The tasks' MLflow service account: the task processes log with it, pipeline code never holds
# it (the training processes report to their task, which logs).
MLFLOW_ACCOUNT = {
    "MLFLOW_TRACKING_USERNAME": "stratoflow-airflow",
    "MLFLOW_TRACKING_PASSWORD": f"sentinel-service-account-{_TOKEN}",
}


def leaked(environ: Mapping[str, str]) -> list[str]:
    """The variables of `environ` that carry a secret: a sentinel value (under any name), or a
    name of Airflow's (`AIRFLOW*`), of the Ray token (`RAY_AUTH_TOKEN*`) or of MLflow's
    (`MLFLOW_*`: its server's address, its accounts)."""
    secrets = {*SECRET_VARIABLES.values(), MLFLOW_ACCOUNT["MLFLOW_TRACKING_PASSWORD"]}
    return sorted(
        name
        for name, value in environ.items()
        if name.startswith(("AIRFLOW", "RAY_AUTH_TOKEN", "MLFLOW_"))
        or any(secret in value for secret in secrets)
    )


ENV_PROBE = '''
"""Writes down the environment of the process running it (a test's probe, not a pipeline's)."""

import json
import os
import sys
import uuid
from pathlib import Path

FOLDER = Path({folder!r})


def dump(where):
    path = FOLDER / f"{{where.replace(' ', '-')}}-{{os.getpid()}}-{{uuid.uuid4().hex[:6]}}.json"
    record = {{"where": where, "pid": os.getpid(), "argv": sys.argv, "environ": dict(os.environ)}}
    path.write_text(json.dumps(record))
'''


def env_probe(folder: Path) -> str:
    """The text of a module `env_probe` for a pipeline folder: its `dump(where)` writes the
    environment of the process that calls it into `folder` (read back with `dumps`)."""
    return ENV_PROBE.format(folder=str(folder))


def dumps(folder: Path) -> list[dict[str, Any]]:
    """What the probes wrote into `folder`: `where`, `pid`, `argv` and `environ` of each call,
    and the `file` it is in."""
    return [
        {**json.loads(path.read_text()), "file": path.name}
        for path in sorted(folder.glob("*.json"))
    ]
