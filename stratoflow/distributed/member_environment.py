"""The environment of every process that runs a pipeline's own code, built from an allowlist.

An Airflow task process holds the deployment's secrets in its environment: Airflow's JWT secret
(enough to mint an Admin token), Fernet key, API secret key and metadata DB URL, and the Ray
token. A pipeline's model, dataset and preprocessing code needs none of them, so the processes
that run it (training members, parameter servers, the first task's own-code check) start from
this allowlist instead of inheriting everything: the system's basics (PATH, HOME, locale,
TMPDIR, proxies and CA bundles), the interpreter's own variables (PYTHON*), TensorFlow's and its
math libraries' tuning (TF_*, XLA, OpenMP, MKL, CUDA, gRPC), stratoflow's stores
(STRATOFLOW_HOME, TFDS_DATA_DIR, STRATOFLOW_PIPELINES_PATH). Nothing of Airflow's, nothing of
Ray's (the Ray token stays with the driver), nothing of MLflow's: the training processes report
their epochs and host samples to the task, which logs them (`stratoflow.distributed.protocol`),
so pipeline code holds neither the tracking server's address nor its service account.

A team passes a variable of its own to its pipeline code by setting it, in the deployment's
environment, with the prefix `STRATOFLOW_PIPELINE_ENV_`: `STRATOFLOW_PIPELINE_ENV_WANDB_API_KEY`
reaches pipeline code as `WANDB_API_KEY` (and wins over an allowlisted variable of that name).
A name of Airflow's, Ray's, MLflow's or stratoflow's own is refused, so no secret of theirs can
be handed on by mistake.

This keeps secrets out of what pipeline code is handed and what a library may log or report;
it is not a sandbox: the code still runs as the worker's OS user (docs/explanation/trust-model.md).
"""

from __future__ import annotations

from collections.abc import Mapping

# How a team names a variable for its pipeline code (the prefix is removed).
TEAM_PREFIX = "STRATOFLOW_PIPELINE_ENV_"

ALLOWED_NAMES = frozenset(
    {
        # The system and the network.
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        # TensorFlow and Keras.
        "XLA_FLAGS",
        "TPU_NAME",
        "KERAS_BACKEND",
        "KERAS_HOME",
        # stratoflow's stores and the pipelines.
        "STRATOFLOW_HOME",
        "STRATOFLOW_PIPELINES_PATH",
        "STRATOFLOW_EXAMPLE_PIPELINES",
        "TFDS_DATA_DIR",
        "DO_NOT_TRACK",
    }
)
ALLOWED_PREFIXES = (
    "LC_",
    "PYTHON",
    "TF_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "ONEDNN_",
    "DNNL_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "GRPC_",
)
# Terraform's variables share TensorFlow's prefix and carry its credentials.
DENIED_PREFIXES = ("TF_VAR_", "TF_TOKEN_", "TF_HTTP_", "TF_CLI_")
# A team's variable may not take a name of the deployment's own services.
RESERVED_PREFIXES = ("AIRFLOW", "RAY_", "MLFLOW_", "STRATOFLOW_")


class PipelineEnvironmentError(ValueError):
    """A team's variable (`STRATOFLOW_PIPELINE_ENV_<NAME>`) would hand on a reserved name."""


def is_allowed(name: str) -> bool:
    """Whether variable `name` of the deployment's environment reaches pipeline code as it is."""
    if name.startswith(DENIED_PREFIXES):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def team_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The team's variables of `environ` (`STRATOFLOW_PIPELINE_ENV_<NAME>`), as `<NAME>`.

    Raises:
        PipelineEnvironmentError: a `<NAME>` is empty or starts like a name of Airflow's, Ray's,
            MLflow's or stratoflow's (the message names the variable, never its value).
    """
    variables = {}
    for name, value in environ.items():
        if not name.startswith(TEAM_PREFIX):
            continue
        handed_as = name.removeprefix(TEAM_PREFIX)
        if not handed_as or handed_as.startswith(RESERVED_PREFIXES):
            raise PipelineEnvironmentError(
                f"{name}: a team's variable reaches pipeline code as the name after "
                f"{TEAM_PREFIX}, which may not be empty nor start with "
                f"{', '.join(RESERVED_PREFIXES)} (the deployment's own services: their "
                "variables are never handed to pipeline code); rename or remove it"
            )
        variables[handed_as] = value
    return variables


def pipeline_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` a process running pipeline code gets: the allowlisted variables,
    then the team's own (prefix removed). A launcher adds its member's settings on top.

    Raises:
        PipelineEnvironmentError: see `team_variables`.
    """
    allowed = {name: value for name, value in environ.items() if is_allowed(name)}
    return {**allowed, **team_variables(environ)}
