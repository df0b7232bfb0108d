# The one image of the docker-compose deployment (docker-compose.yml builds it as
# stratoflow:<project version>). Every stratoflow container runs it with its own command: the
# Airflow components (api-server, scheduler, dag-processor, triggerer, init), the MLflow tracking
# server and the standing TensorFlow servers (ps-0, worker-0, worker-1). One image rather than
# three because a parameter-server run ships traced TensorFlow functions from the coordinator
# (a task in the Airflow scheduler) to the servers, and both ends must run the same TensorFlow,
# Keras and stratoflow code; MLflow's server and its clients likewise share one MLflow version.
#
# The base is the official Airflow image at the exact release pyproject.toml pins
# (apache-airflow==3.3.*): it brings Airflow, its providers (postgres: psycopg2 and psycopg 3;
# fab, the auth manager, which the project's `services` extra sets to the version pyproject.toml
# pins), the entrypoint, dumb-init and curl.
FROM apache/airflow:3.3.2-python3.11

# root (numeric ids: hadolint DL3066)
USER 0
# Mount points of the compose file's named volumes. A new named volume copies the ownership of
# the folder it is first mounted on, so these make every volume writable by the airflow user
# (uid 50000, gid 0) without a chown step at start.
RUN mkdir -p /opt/stratoflow/src /opt/stratoflow/home /opt/stratoflow/tensorflow_datasets \
        /opt/mlflow/artifacts \
    && chown -R airflow:0 /opt/stratoflow /opt/mlflow

# the image's airflow user: pip installs into its environment, and every container runs as it
USER 50000
WORKDIR /opt/stratoflow/src
COPY --chown=airflow:0 pyproject.toml README.md ./
COPY --chown=airflow:0 stratoflow ./stratoflow
COPY --chown=airflow:0 dags ./dags
COPY --chown=airflow:0 tasks ./tasks
COPY --chown=airflow:0 pipelines ./pipelines
COPY --chown=airflow:0 deploy ./deploy
# The project with the dependencies it pins (TensorFlow, Keras, MLflow, TFDS...), baked into the
# image rather than installed at every start (_PIP_ADDITIONAL_REQUIREMENTS). Naming
# apache-airflow at the base image's version keeps pip from moving Airflow while it resolves.
# Extras: `services` (PostgreSQL, the FAB auth manager) and `ray` (the compose file's Ray nodes
# and the tasks that drive them); docs/reference/install.md.
RUN pip install --no-cache-dir "apache-airflow[postgres]==${AIRFLOW_VERSION}" "./[services,ray]"

# Defaults for every container; docker-compose.yml sets the same values explicitly.
ENV STRATOFLOW_HOME=/opt/stratoflow/home \
    TFDS_DATA_DIR=/opt/stratoflow/tensorflow_datasets \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/stratoflow/src/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    MLFLOW_DISABLE_TELEMETRY=true
