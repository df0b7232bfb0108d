"""MLflow's basic-auth app as stratoflow runs it: its config file and the tasks' service account.

The services stack (`stratoflow.services.stack`) and the compose deployment (`deploy/mlflow-
server.sh`, service `mlflow-init`) both use this module, so they configure the same thing:

- `python -m stratoflow.services.mlflow_auth write-config PATH` writes the app's ini (read by
  default for every signed-in user, the user store at `$MLFLOW_AUTH_DATABASE_URI`), private;
- `python -m stratoflow.services.mlflow_auth service-account` creates the account the Airflow
  tasks log and register with (`$MLFLOW_SERVICE_USERNAME` / `$MLFLOW_SERVICE_PASSWORD`), signed
  in as the admin (`$MLFLOW_AUTH_ADMIN_USERNAME` / `$MLFLOW_AUTH_ADMIN_PASSWORD`) at
  `$MLFLOW_TRACKING_URI`, or resets its password; then claims every discovered pipeline's
  experiment and registered model for it (`claim_pipeline_names`). Passwords only ever travel
  in the environment.

The service account is an ordinary user, not an admin: MLflow gives the creator of an experiment
or registered model MANAGE on it, so the account can log runs, register versions and move
aliases on what it created, while it cannot manage users or touch other experiments and models
beyond reading them. Any signed-in MLflow user may create experiments and registered models,
so the account creates the pipelines' own at every start, before anyone else can
(`stratoflow.tracking.name_claims`); a name another user took first is reported with its owner
and the fix, and that pipeline's runs refuse to start until an admin acts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratoflow.config.spec import PipelineSpec
    from stratoflow.tracking.name_claims import NameClaim, Rest

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
    from stratoflow.services.state_files import write_private_text

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


def claim_pipeline_names(
    tracking_uri: str,
    admin: tuple[str, str],
    account: tuple[str, str],
    specs: Iterable[PipelineSpec],
) -> list[NameClaim]:
    """Claim every pipeline's experiment and registered model for `account`.

    Each name that does not exist is created by the account (MLflow makes it the manager). One
    that exists and that no user manages (made before sign-in was required, or by a user since
    deleted) is granted to the account by the admin. One that another user manages is left to
    them, and its claim names them: an admin decides (`NameClaim.problem` says how).

    Args:
        tracking_uri: the MLflow server.
        admin: (username, password) of an MLflow admin.
        account: (username, password) of the account the pipelines' runs log as.
        specs: the pipelines.

    Returns:
        One claim per name, in order; `usable` is False for a name the account cannot use.

    Raises:
        ClaimError: MLflow refused a lookup or a creation.
    """
    import httpx

    from stratoflow.tracking import name_claims

    wanted = list(
        dict.fromkeys(pair for spec in specs for pair in name_claims.pipeline_names(spec))
    )
    base = tracking_uri.rstrip("/")
    with (
        httpx.Client(base_url=base, auth=account, timeout=30) as as_account,
        httpx.Client(base_url=base, auth=admin, timeout=30) as as_admin,
    ):
        claims = name_claims.claim_names(name_claims.rest_over(as_account.request), wanted)
        return [_settle(name_claims.rest_over(as_admin.request), claim) for claim in claims]


def _settle(admin: Rest, claim: NameClaim) -> NameClaim:
    """A name the account does not hold: name its owners, or grant it if it has none."""
    from stratoflow.tracking import name_claims

    if claim.outcome != name_claims.TAKEN:
        return claim
    status, answer = admin("GET", "/api/2.0/mlflow/users/list", {})
    name_claims.expect(status, answer, "the list of users")
    owners = tuple(
        user["username"]
        for user in answer["users"]
        if user["username"] != claim.account
        and name_claims.own_permission(admin, user["username"], claim.kind, claim.resource_id)
        == name_claims.NEEDED_PERMISSION
    )
    if owners:
        return replace(claim, owners=owners)
    status, answer = admin(
        "POST",
        name_claims.GRANT_PATH,
        {
            "username": claim.account,
            "resource_type": claim.kind,
            "resource_id": claim.resource_id,
            "permission": name_claims.NEEDED_PERMISSION,
        },
    )
    name_claims.expect(status, answer, f"granting {claim.label} to {claim.account}")
    return replace(
        claim, outcome=name_claims.GRANTED, permission=name_claims.NEEDED_PERMISSION, owners=()
    )


def report_claims(claims: Iterable[NameClaim]) -> list[str]:
    """Log each claim (a name another user owns as a warning); return those problems."""
    problems = []
    for claim in claims:
        if claim.usable:
            log.info("%s", claim.describe())
        else:
            problems.append(claim.problem())
            log.warning("%s", problems[-1])
    return problems


def main(argv: list[str] | None = None) -> int:
    """`write-config PATH` or `service-account` (see the module docstring); settings from env."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write-config", help=f"write the ini (${DATABASE_URI_ENV})")
    write.add_argument("path", type=Path)
    commands.add_parser(
        "service-account",
        help="create or update the tasks' account; claim every pipeline's MLflow names for it",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
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

    from stratoflow.config.assets import loadable_specs
    from stratoflow.tracking.name_claims import ClaimError

    uri = os.environ["MLFLOW_TRACKING_URI"]
    admin = (os.environ["MLFLOW_AUTH_ADMIN_USERNAME"], os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"])
    account = (os.environ[SERVICE_USERNAME_ENV], os.environ[SERVICE_PASSWORD_ENV])
    try:
        outcome = ensure_account(uri, admin, *account)
        log.info("MLflow account %s %s", account[0], outcome)
        # A name another user owns is reported, not fatal: the other pipelines still run.
        report_claims(claim_pipeline_names(uri, admin, account, loadable_specs()))
    except (MlflowAuthError, ClaimError, httpx.HTTPError) as error:
        log.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
