#!/usr/bin/env bash
# Entrypoint of the compose file's mlflow service: writes the basic-auth app's config (its user
# store, database `mlflow_auth`, from $MLFLOW_AUTH_DATABASE_URI) where $MLFLOW_AUTH_CONFIG_PATH
# points, readable by this user only, then runs `mlflow server` with the service's arguments.
# stratoflow/services/mlflow_auth.py writes the same file for `make services`.
set -euo pipefail
: "${MLFLOW_AUTH_CONFIG_PATH:?the basic-auth config path is not configured}"
: "${MLFLOW_AUTH_DATABASE_URI:?the basic-auth user store is not configured}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?MLFLOW_ADMIN_PASSWORD is not set (see .env.example)}"
# What it writes (the artifact store of `--serve-artifacts`) is its owner's only.
umask 0077
python -m stratoflow.services.mlflow_auth write-config "$MLFLOW_AUTH_CONFIG_PATH"
exec mlflow server "$@"
