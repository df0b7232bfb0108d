#!/usr/bin/env bash
# One-shot initialisation of the docker-compose deployment (service airflow-init; every other
# Airflow service waits for it to exit 0). Creates or upgrades Airflow's metadata DB, then writes
# the admin's password where SimpleAuthManager reads it ($AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_
# PASSWORDS_FILE, on a volume only this service and the api-server mount). Rerunning it after
# changing AIRFLOW_ADMIN_PASSWORD in .env changes the password.
set -euo pipefail
: "${AIRFLOW_ADMIN_USERNAME:?AIRFLOW_ADMIN_USERNAME is not set (see .env.example)}"
: "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set (see .env.example)}"
: "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?the passwords file is not configured}"

airflow db migrate

python - <<'PY'
import json
import os
from pathlib import Path

path = Path(os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
path.parent.mkdir(parents=True, exist_ok=True)
# Written whole, readable by the airflow user only: SimpleAuthManager keeps passwords in clear.
tmp = path.with_suffix(".tmp")
with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
    json.dump({os.environ["AIRFLOW_ADMIN_USERNAME"]: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, file)
os.chmod(tmp, 0o600)
tmp.replace(path)
print(f"airflow-init: Airflow DB migrated; password of {os.environ['AIRFLOW_ADMIN_USERNAME']} set")
PY
