#!/usr/bin/env bash
# Runs its arguments with umask 077, so that what the program writes (task logs, run folders,
# checkpoints, the files of MLflow's artifact store) is its owner's only, as in `make services`
# (stratoflow/services/file_modes.py). The Airflow image's entrypoint sets umask 0002 just before
# it runs a container's command, so docker-compose.yml's Airflow services run theirs through
# this script (the entrypoint's `bash` command: `bash owner-only.sh airflow scheduler`).
set -euo pipefail
umask 0077
exec "$@"
