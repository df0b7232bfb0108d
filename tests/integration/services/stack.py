"""The live services stack the tests of this package share, and what they do to it.

One stack (`live` in this package's conftest.py) serves every module here: it takes about two
minutes to start on 2 cores, so it is started once for the package.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from stratoflow.services import Stack, StartReport
from stratoflow.services.airflow_api import AirflowApi


@dataclass
class LiveStack:
    stack: Stack
    report: StartReport
    api: AirflowApi

    @property
    def mlflow_uri(self) -> str:
        assert self.stack.config is not None
        return self.stack.config.mlflow_uri

    @property
    def api_url(self) -> str:
        assert self.stack.config is not None
        return self.stack.config.api_url

    def mlflow(self) -> Any:
        from mlflow import MlflowClient

        # Not `tracking.client()`: it sets the process-wide URI other test modules rely on.
        return MlflowClient(tracking_uri=self.mlflow_uri, registry_uri=self.mlflow_uri)


def unpause_and_cancel_the_missed_slot(api: AirflowApi, dag_id: str) -> dict[str, Any]:
    """Unpause a cron DAG; Airflow (catchup off) runs its latest cron slot at once: cancel it.

    Another module on the same stack may have unpaused the DAG already: its slot's run is
    then there, cancelled, and is returned as it is.

    Returns the scheduled run, to show the cron schedule works.
    """
    api.set_paused(dag_id, False)
    deadline = time.monotonic() + 60
    while not (runs := [r for r in api.runs(dag_id) if r["run_type"] == "scheduled"]):
        assert time.monotonic() < deadline, f"{dag_id}: no scheduled run 60 s after unpausing"
        time.sleep(0.5)
    (scheduled,) = runs
    if scheduled["state"] != "failed":
        api.set_run_state(dag_id, scheduled["dag_run_id"], "failed")
    return scheduled


def add_airflow_user(api: AirflowApi, username: str, role: str, password: str = "") -> str:
    """Create an Airflow user with `role` as the admin does (FAB's user API); its password.

    Args:
        api: the admin's client.
        username: the new user.
        role: a FAB role (Admin, Op, User, Viewer, Public).
        password: the password to give; a new random one if empty.
    """
    password = password or secrets.token_urlsafe(18)
    api.request(
        "POST",
        "/auth/fab/v1/users",
        json={
            "username": username,
            "email": f"{username}@example.com",
            "first_name": username,
            "last_name": "test",
            "roles": [{"name": role}],
            "password": password,
        },
    )
    return password
