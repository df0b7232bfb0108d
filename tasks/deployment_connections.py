"""The deployment's Airflow Connections, applied to a task process before it does anything.

Every task body and failure callback starts with `stratoflow.dags.factory.airflow_run`, which calls
`apply_connections` first: where the Airflow deployment defines the connection
`stratoflow_mlflow` (UI, CLI, `AIRFLOW_CONN_STRATOFLOW_MLFLOW`, a secrets backend), its tracking
URI and service account replace this process's MLflow environment variables; where it does not,
the environment stays as the deployment set it. Airflow masks the connection's password in the
task logs. Training members get the allowlist of this environment they got before.

A Ray cluster's connection (`stratoflow_ray_<name>`) is looked up by the training task when it
connects (`lookup`, handed to `stratoflow.distributed.launchers.launcher_for`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from stratoflow.config import connections
from stratoflow.config.connections import ConnectionFields

logger = logging.getLogger(__name__)


def lookup(conn_id: str) -> ConnectionFields | None:
    """The deployment's connection `conn_id` (`connections.Lookup`), or None where it has none."""
    try:
        return ConnectionFields.of(Connection.get(conn_id))
    except AirflowNotFoundException:
        return None


def apply_connections(environ: MutableMapping[str, str] | None = None) -> bool:
    """Put the `stratoflow_mlflow` connection, when the deployment has one, into `environ`.

    Args:
        environ: the environment to change (this process's by default).

    Returns:
        Whether the connection was found and applied.

    Raises:
        ConnectionConfigError: the connection exists but is malformed (names the field).
    """
    environ = os.environ if environ is None else environ
    fields = lookup(connections.MLFLOW_CONNECTION_ID)
    if fields is None:
        return False
    settings = connections.mlflow_environment(fields)
    for name, value in settings.items():
        if value:
            environ[name] = value
        else:
            environ.pop(name, None)
    logger.info(
        "MLflow tracking server from the Airflow connection %r: %s",
        connections.MLFLOW_CONNECTION_ID,
        settings[connections.locations.TRACKING_URI_ENV],
    )
    return True


class MlflowTrackingHook(BaseHook):
    """The hook behind the `stratoflow_mlflow` connection type (Airflow's connection form).

    `tracking_environment()` is what `apply_connections` sets from the connection.
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = connections.MLFLOW_CONNECTION_ID
    conn_type = connections.MLFLOW_CONNECTION_TYPE
    hook_name = "MLflow tracking server (stratoflow)"

    def __init__(self, mlflow_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id

    def tracking_environment(self) -> dict[str, str]:
        """The MLflow client's environment variables this connection stands for."""
        fields = ConnectionFields.of(self.get_connection(self.mlflow_conn_id))
        return connections.mlflow_environment(fields)


class RayClusterHook(BaseHook):
    """The hook behind the `stratoflow_ray` connection type: a Ray cluster's address and token."""

    conn_name_attr = "ray_conn_id"
    default_conn_name = connections.ray_connection_id("default")
    conn_type = connections.RAY_CONNECTION_TYPE
    hook_name = "Ray cluster (stratoflow)"

    def __init__(self, ray_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.ray_conn_id = ray_conn_id
