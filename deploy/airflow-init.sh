#!/usr/bin/env bash
# One-shot initialisation of the docker-compose deployment (service airflow-init; every other
# Airflow service waits for it to exit 0). Creates or upgrades Airflow's metadata DB (with the
# FAB auth manager's user and role tables), then creates the admin (role Admin) with the
# password from .env, or resets it: rerunning it after changing AIRFLOW_ADMIN_PASSWORD in .env
# changes the password. The password goes through the environment, never a command line.
set -euo pipefail
: "${AIRFLOW_ADMIN_USERNAME:?AIRFLOW_ADMIN_USERNAME is not set (see .env.example)}"
: "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set (see .env.example)}"

# What it writes is its owner's only.
umask 0077

airflow db migrate

STRATOFLOW_AIRFLOW_USER_PASSWORD="$AIRFLOW_ADMIN_PASSWORD" \
    python -m stratoflow.services.airflow_users --username "$AIRFLOW_ADMIN_USERNAME" --role Admin
echo "airflow-init: Airflow DB migrated; admin $AIRFLOW_ADMIN_USERNAME set"
