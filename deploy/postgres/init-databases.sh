#!/usr/bin/env bash
# Creates the deployment's databases, each owned by its own login role: `airflow` (Airflow's
# metadata DB, with the FAB auth manager's users and roles), `mlflow` (MLflow's tracking and model
# registry store) and `mlflow_auth` (the user store of MLflow's basic-auth app, owned by `mlflow`). The postgres image runs
# this once, when its data volume is new (/docker-entrypoint-initdb.d/), as the superuser
# $POSTGRES_USER; the passwords come from the environment (.env), never from this file.
# Neither role may connect to the other's database.
set -euo pipefail
: "${AIRFLOW_DB_PASSWORD:?AIRFLOW_DB_PASSWORD is not set (see .env.example)}"
: "${MLFLOW_DB_PASSWORD:?MLFLOW_DB_PASSWORD is not set (see .env.example)}"

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v airflow_password="$AIRFLOW_DB_PASSWORD" -v mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
REVOKE ALL ON DATABASE airflow FROM PUBLIC;
CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
CREATE DATABASE mlflow_auth OWNER mlflow;
REVOKE ALL ON DATABASE mlflow_auth FROM PUBLIC;
SQL
