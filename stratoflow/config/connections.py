"""The Airflow Connections a deployment configures stratoflow with, and what each one means.

An operator manages the MLflow tracking server (its URI and the service account) as the Airflow
Connection `stratoflow_mlflow`, in the Airflow UI, the CLI or a secrets backend, instead of
environment variables. The connection types appear in Airflow's connection form because the
distribution registers `provider_info` under Airflow's `apache_airflow_provider` entry point.

Only the task processes look connections up (`stratoflow.tasks.deployment_connections`): a task
process puts what a connection says into its own environment, where the MLflow client and the
launchers already read it, and training members receive their allowlist of it as before
(`stratoflow.distributed.member_environment`). Where no connection is defined, the environment
variables of earlier versions stay in force.

This module is data and parsing only: it imports nothing of Airflow, so the connection form can
be drawn without importing stratoflow's engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stratoflow.config import locations
from stratoflow.config.parsing import SpecError

MLFLOW_CONNECTION_ID = "stratoflow_mlflow"
MLFLOW_CONNECTION_TYPE = "stratoflow_mlflow"
# What MLflow's client reads to authenticate against a tracking server.
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
CREDENTIAL_ENV = (USERNAME_ENV, PASSWORD_ENV, TOKEN_ENV)
TRACKING_SCHEMES = ("http", "https")
RAY_CONNECTION_TYPE = "stratoflow_ray"


class ConnectionConfigError(SpecError):
    """A deployment's connection is malformed (the message names the connection and field)."""


@dataclass(frozen=True)
class ConnectionFields:
    """The fields of one Airflow Connection, as stratoflow reads them.

    A plain copy, so this module parses a connection without importing Airflow.
    """

    conn_id: str
    host: str | None = None
    port: int | None = None
    schema: str | None = None
    login: str | None = None
    password: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, connection: Any) -> ConnectionFields:
        """The fields of an `airflow.sdk.Connection` (or anything with its attributes)."""
        return cls(
            conn_id=connection.conn_id,
            host=connection.host or None,
            port=connection.port or None,
            schema=connection.schema or None,
            login=connection.login or None,
            password=connection.password or None,
            extra=dict(connection.extra_dejson or {}),
        )


# conn_id → the connection's fields, or None where the deployment defines no such connection.
Lookup = Callable[[str], "ConnectionFields | None"]


def no_connections(conn_id: str) -> ConnectionFields | None:
    """The `Lookup` outside Airflow: no connection is ever defined."""
    return None


def ray_connection_id(cluster: str) -> str:
    """The Airflow Connection holding the Ray cluster `cluster`'s address and token."""
    return f"stratoflow_ray_{cluster}"


def mlflow_environment(fields: ConnectionFields) -> dict[str, str]:
    """What the connection `stratoflow_mlflow` sets in a task process's environment.

    The host is the tracking server's URL (`https://mlflow.example.org`, or a bare host name
    with the connection's schema, `http` by default, and port). A login and a password are the
    service account (HTTP basic authentication); a password without a login is a bearer token.
    Both are cleared when the connection has none, so an environment's credentials never go to
    the connection's server.

    Raises:
        ConnectionConfigError: no host, or a scheme other than http/https.
    """
    where = f"Airflow connection {fields.conn_id!r}"
    if not fields.host:
        raise ConnectionConfigError(f"{where}: host is empty; expected the tracking server's URL")
    scheme, separator, rest = fields.host.partition("://")
    if not separator:
        scheme, rest = fields.schema or "http", fields.host
    if scheme not in TRACKING_SCHEMES:
        raise ConnectionConfigError(
            f"{where}: scheme {scheme!r} is not one of {list(TRACKING_SCHEMES)}"
        )
    address = rest.rstrip("/")
    if fields.port and ":" not in address.split("/", 1)[0]:
        host, slash, path = address.partition("/")
        address = f"{host}:{fields.port}{slash}{path}"
    environment = {locations.TRACKING_URI_ENV: f"{scheme}://{address}"}
    environment[USERNAME_ENV] = fields.login or ""
    environment[PASSWORD_ENV] = fields.password if fields.login and fields.password else ""
    environment[TOKEN_ENV] = fields.password if fields.password and not fields.login else ""
    return environment


def provider_info() -> dict[str, Any]:
    """stratoflow as an Airflow provider: its connection types, for Airflow's connection form.

    Registered under the `apache_airflow_provider` entry point (pyproject.toml). Airflow draws
    the form from this metadata alone; the hook class is imported only where a hook is asked for.
    """
    return {
        "package-name": "stratoflow",
        "name": "stratoflow",
        "description": "Retraining pipelines for TensorFlow: the MLflow server and Ray clusters.",
        "connection-types": [
            {
                "connection-type": MLFLOW_CONNECTION_TYPE,
                "hook-class-name": "stratoflow.tasks.deployment_connections.MlflowTrackingHook",
                "hook-name": "MLflow tracking server (stratoflow)",
                "ui-field-behaviour": {
                    "hidden-fields": ["extra"],
                    "relabeling": {
                        "host": "Tracking server URL",
                        "login": "Username",
                        "password": "Password (or token, without a username)",
                    },
                    "placeholders": {
                        "host": "https://mlflow.example.org",
                        "schema": "http or https (when the URL has none)",
                    },
                },
            },
            {
                "connection-type": RAY_CONNECTION_TYPE,
                "hook-class-name": "stratoflow.tasks.deployment_connections.RayClusterHook",
                "hook-name": "Ray cluster (stratoflow)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "extra"],
                    "relabeling": {"host": "Ray address", "password": "Ray auth token"},
                    "placeholders": {"host": "ray://ray-head.example.org or head-host"},
                },
            },
        ],
    }
