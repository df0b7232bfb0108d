"""The Airflow Connection `stratoflow_mlflow`: what each form of it sets for MLflow's client, the
errors naming the connection and field, and the connection type in Airflow's own form metadata."""

from __future__ import annotations

import pytest

from stratoflow.config import connections
from stratoflow.config.connections import ConnectionConfigError, ConnectionFields


def environment_of(**fields: object) -> dict[str, str]:
    return connections.mlflow_environment(ConnectionFields(conn_id="stratoflow_mlflow", **fields))  # type: ignore[arg-type]


def test_a_url_host_with_a_service_account_sets_uri_and_basic_credentials() -> None:
    assert environment_of(host="https://mlflow.example.org/", login="svc", password="pw") == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.org",
        "MLFLOW_TRACKING_USERNAME": "svc",
        "MLFLOW_TRACKING_PASSWORD": "pw",
        "MLFLOW_TRACKING_TOKEN": "",
    }


def test_a_bare_host_takes_the_schema_and_port_and_a_lone_password_is_a_token() -> None:
    environment = environment_of(host="mlflow.internal", port=5443, schema="https", password="t")
    assert environment["MLFLOW_TRACKING_URI"] == "https://mlflow.internal:5443"
    assert (environment["MLFLOW_TRACKING_TOKEN"], environment["MLFLOW_TRACKING_PASSWORD"]) == (
        "t",
        "",
    )


def test_a_port_goes_before_a_path_and_a_url_keeps_its_own_port() -> None:
    assert (
        environment_of(host="http://proxy/mlflow", port=8080)["MLFLOW_TRACKING_URI"]
        == "http://proxy:8080/mlflow"
    )
    assert (
        environment_of(host="http://127.0.0.1:5000", port=9)["MLFLOW_TRACKING_URI"]
        == "http://127.0.0.1:5000"
    )


def test_a_connection_without_credentials_clears_the_environments_own() -> None:
    # Empty values are removed by `apply_connections`: an environment's service account must not
    # be presented to the server the connection names.
    environment = environment_of(host="http://127.0.0.1:5000")
    assert {name: environment[name] for name in connections.CREDENTIAL_ENV} == dict.fromkeys(
        connections.CREDENTIAL_ENV, ""
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "host is empty"),
        ({"host": "file:///tmp/mlruns"}, "scheme 'file' is not one of ['http', 'https']"),
        ({"host": "mlflow", "schema": "ftp"}, "scheme 'ftp'"),
    ],
)
def test_a_malformed_connection_is_refused_naming_it_and_the_field(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(
        ConnectionConfigError, match="Airflow connection 'stratoflow_mlflow'"
    ) as error:
        environment_of(**fields)
    assert named in str(error.value)


def test_airflow_draws_the_connection_type_from_the_installed_entry_point() -> None:
    from airflow.providers_manager import ProvidersManager

    drawn = {
        meta.connection_type: meta
        for meta in ProvidersManager().iter_connection_type_hook_ui_metadata()
    }
    meta = drawn[connections.MLFLOW_CONNECTION_TYPE]
    assert meta.hook_name == "MLflow tracking server (stratoflow)"
    assert meta.field_behaviour is not None
    assert meta.field_behaviour["relabeling"]["host"] == "Tracking server URL"
