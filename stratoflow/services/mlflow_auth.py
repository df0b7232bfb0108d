"""MLflow's basic-auth app as stratoflow runs it: its config file and the tasks' service account.

The services stack (`stratoflow.services.stack`) and the compose deployment (`deploy/mlflow-
server.sh`, service `mlflow-init`) both use this module, so they configure the same thing:

- `python -m stratoflow.services.mlflow_auth write-config PATH` writes the app's ini (read by
  default for every signed-in user, the user store at `$MLFLOW_AUTH_DATABASE_URI`), private;
- `python -m stratoflow.services.mlflow_auth service-account` creates the account the Airflow
  tasks log and register with (`$MLFLOW_SERVICE_USERNAME` / `$MLFLOW_SERVICE_PASSWORD`), signed
  in as the admin (`$MLFLOW_AUTH_ADMIN_USERNAME` / `$MLFLOW_AUTH_ADMIN_PASSWORD`) at
  `$MLFLOW_TRACKING_URI`, or resets its password. Passwords only ever travel in the environment.

The service account is an ordinary user, not an admin: MLflow gives the creator of an experiment
or registered model MANAGE on it, so the account can log runs, register versions and move
aliases on what the retrain DAGs create, while it cannot manage users or touch other
experiments and models beyond reading them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# Everyone signed in may read; writing needs a grant (or being the creator, who gets MANAGE).
DEFAULT_PERMISSION = "READ"
# Every request's password check costs a scrypt hash (about 0.15 s of CPU on the 2-core test
# host); cached per (user, password) for this long. A changed password or a deleted user is
# seen at once by the worker that made the change, by other workers (compose runs 2) within
# this TTL.
AUTH_CACHE_TTL_SECONDS = 60
DATABASE_URI_ENV = "MLFLOW_AUTH_DATABASE_URI"
SERVICE_USERNAME_ENV = "MLFLOW_SERVICE_USERNAME"
SERVICE_PASSWORD_ENV = "MLFLOW_SERVICE_PASSWORD"


class MlflowAuthError(RuntimeError):
    """The MLflow server refused to set up an account; the message has its answer."""


def auth_config(database_uri: str) -> str:
    """The basic-auth app's ini: READ by default, the user store at `database_uri`.

    The admin's name and password come from the environment (`MLFLOW_AUTH_ADMIN_USERNAME`,
    `MLFLOW_AUTH_ADMIN_PASSWORD`), read by MLflow when the user store is new.
    """
    # configparser interpolates `%`: doubled, a password may contain it.
    uri = database_uri.replace("%", "%%")
    return (
        "[mlflow]\n"
        f"default_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = {uri}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_SECONDS}\n"
    )


def write_config(path: Path, database_uri: str) -> None:
    """Write `auth_config(database_uri)` to `path`, readable by its owner only."""
    from stratoflow.services.processes import write_private_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_text(path, auth_config(database_uri))


def ensure_account(tracking_uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Create MLflow user `username` with `password`, or reset its password if it exists.

    Args:
        tracking_uri: the MLflow server.
        admin: (username, password) of an MLflow admin.
        username: the account.
        password: its password.

    Returns:
        "created" or "updated".

    Raises:
        MlflowAuthError: the server refused (e.g. wrong admin password).
    """
    import httpx

    account = {"username": username, "password": password}
    with httpx.Client(base_url=tracking_uri.rstrip("/"), auth=admin, timeout=30) as http:
        known = http.get("/api/2.0/mlflow/users/get", params={"username": username})
        if known.status_code == 200:
            answer = http.patch("/api/2.0/mlflow/users/update-password", json=account)
            outcome = "updated"
        else:
            answer = http.post("/api/2.0/mlflow/users/create", json=account)
            outcome = "created"
    if answer.status_code >= 300:
        raise MlflowAuthError(
            f"MLflow refused to set up the account {username}: "
            f"HTTP {answer.status_code}: {answer.text[:500]}"
        )
    return outcome


def main(argv: list[str] | None = None) -> int:
    """`write-config PATH` or `service-account` (see the module docstring); settings from env."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write-config", help=f"write the ini (${DATABASE_URI_ENV})")
    write.add_argument("path", type=Path)
    commands.add_parser("service-account", help="create or update the tasks' account")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    needed = (
        [DATABASE_URI_ENV]
        if args.command == "write-config"
        else [
            "MLFLOW_TRACKING_URI",
            "MLFLOW_AUTH_ADMIN_USERNAME",
            "MLFLOW_AUTH_ADMIN_PASSWORD",
            SERVICE_USERNAME_ENV,
            SERVICE_PASSWORD_ENV,
        ]
    )
    missing = [name for name in needed if not os.environ.get(name)]
    if missing:
        log.error("not set in the environment: %s", ", ".join(missing))
        return 2
    if args.command == "write-config":
        write_config(args.path, os.environ[DATABASE_URI_ENV])
        log.info("MLflow basic-auth config written to %s", args.path)
        return 0
    import httpx

    try:
        outcome = ensure_account(
            os.environ["MLFLOW_TRACKING_URI"],
            (os.environ["MLFLOW_AUTH_ADMIN_USERNAME"], os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"]),
            os.environ[SERVICE_USERNAME_ENV],
            os.environ[SERVICE_PASSWORD_ENV],
        )
    except (MlflowAuthError, httpx.HTTPError) as error:
        log.error("%s", error)
        return 1
    log.info("MLflow account %s %s", os.environ[SERVICE_USERNAME_ENV], outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
