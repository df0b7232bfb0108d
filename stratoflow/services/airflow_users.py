"""Users of Airflow's FAB auth manager: create one with a role, or reset its password and role.

The services stack (`stratoflow.services.stack`) and the compose deployment
(`deploy/airflow-init.sh`) create the admin with it on every start, so a changed secret takes
effect. Run in Airflow's environment (metadata DB, `AIRFLOW_HOME`); the password comes from the
environment variable `PASSWORD_ENV`, never from the command line:

    STRATOFLOW_AIRFLOW_USER_PASSWORD=... python -m stratoflow.services.airflow_users \\
        --username admin --role Admin

The FAB roles: Admin (everything), Op (and User: trigger, clear and pause DAG runs), Viewer
(read only), Public (nothing).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

log = logging.getLogger(__name__)

PASSWORD_ENV = "STRATOFLOW_AIRFLOW_USER_PASSWORD"


def ensure_user(username: str, role: str, password: str) -> str:
    """Create `username` with `role` and `password`, or give an existing one both.

    Args:
        username: the login.
        role: a FAB role that exists (Admin, Op, User, Viewer, Public).
        password: the password to set.

    Returns:
        "created" or "updated".

    Raises:
        ValueError: `role` does not exist (the message lists those that do).
    """
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    with get_application_builder() as appbuilder:
        security = appbuilder.sm
        # Creates the default roles (Admin, Op, User, Viewer, Public) if a new DB lacks them.
        security.sync_roles()
        role_object = security.find_role(role)
        if role_object is None:
            known = ", ".join(sorted(r.name for r in security.get_all_roles()))
            raise ValueError(f"role: {role!r} is not a role of this Airflow; known: {known}")
        user = security.find_user(username=username)
        if user is None:
            created = security.add_user(
                username, username, "-", f"{username}@localhost", role_object, password
            )
            if not created:
                raise RuntimeError(f"Airflow did not create the user {username!r}")
            return "created"
        security.reset_password(user.id, password)
        if [r.name for r in user.roles] != [role]:
            user.roles = [role_object]
            security.update_user(user)
        return "updated"


def main(argv: list[str] | None = None) -> int:
    """`python -m stratoflow.services.airflow_users --username U --role R` (password from env)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--username", required=True)
    parser.add_argument("--role", required=True, help="Admin, Op, User, Viewer or Public")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        log.error("%s is not set: it holds the user's password", PASSWORD_ENV)
        return 2
    try:
        outcome = ensure_user(args.username, args.role, password)
    except ValueError as error:
        log.error("%s", error)
        return 2
    log.info("Airflow user %s %s with role %s", args.username, outcome, args.role)
    return 0


if __name__ == "__main__":
    sys.exit(main())
