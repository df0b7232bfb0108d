"""`stratoflow serve-model`: a pipeline's registered model behind MLflow's scoring server.

`mlflow models serve -m models:/<name>@champion` alone builds a virtualenv and pip-installs the
model's requirements (TensorFlow) unless given `--env-manager local`, then needs `uvicorn` on
PATH, and reads whatever tracking URI its shell has. Here the alias is resolved to one version on
the store stratoflow uses (`locations.tracking_uri()`), that version is copied into a private
folder, and the scoring server (`mlflow.pyfunc.scoring_server` under this interpreter's
`uvicorn`, what `--env-manager local` runs) serves the copy on 127.0.0.1. So the server needs no
MLflow access: its environment keeps no MLflow credentials, only the command that resolved and
copied the model holds them (from its environment, never on a command line).

The process itself (start, wait, stop on Ctrl-C) is run by `stratoflow.cli.model_server`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratoflow.config import connections, locations
from stratoflow.config.spec import load_spec
from stratoflow.tracking import mlflow_runs

logger = logging.getLogger(__name__)

# Loopback only: the scoring server has no authentication of its own.
HOST = "127.0.0.1"
# 5000 is MLflow's own UI and server port; the scoring server takes the next one by default.
DEFAULT_PORT = 5001
# What MLflow's client presents to a tracking server; the scoring server gets none of it.
CREDENTIAL_ENV = connections.CREDENTIAL_ENV
# How long a uvicorn worker may take to answer its supervisor's health check (loading included).
WORKER_HEALTHCHECK_SECONDS = 120
# Longer than this, a one-row example is referred to by its file instead of printed inline.
INLINE_EXAMPLE_CHARS = 2000


class ServingError(RuntimeError):
    """The model cannot be served; the message says why and what to do."""


@dataclass(frozen=True)
class ModelVersionToServe:
    """One version of a pipeline's registered model, found through an alias."""

    pipeline: str
    registered_model: str
    alias: str
    version: str
    tracking_uri: str

    @property
    def uri(self) -> str:
        """The version's own URI: the alias may move while it is served."""
        return f"models:/{self.registered_model}/{self.version}"


def resolve_model(pipeline: str, alias: str) -> ModelVersionToServe:
    """The version that `models:/<pipeline's registered model>@<alias>` names now.

    Args:
        pipeline: a pipeline name; its spec names the registered model.
        alias: a registered model alias, e.g. `champion`.

    Raises:
        SpecError: the pipeline does not load.
        ServingError: the tracking store is unreachable or absent, refuses these credentials,
            has no such registered model, or no version has the alias (the message lists the
            aliases it has).
    """
    name = load_spec(pipeline).registered_model
    uri = locations.tracking_uri()
    _check_store(uri, pipeline)  # before importing MLflow: seconds sooner when it fails
    from mlflow.exceptions import MlflowException

    client = mlflow_runs.client(uri)
    try:
        model = client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise ServingError(
                f"pipeline {pipeline}: no registered model {name!r} in {uri} yet; train it "
                f"first (`stratoflow run {pipeline}`)"
            ) from None
        raise ServingError(_refusal(uri, name, error)) from None
    aliases = dict(model.aliases or {})
    if alias not in aliases:
        have = ", ".join(f"{a} (version {v})" for a, v in sorted(aliases.items())) or "none"
        raise ServingError(
            f"pipeline {pipeline}: registered model {name!r} has no version with alias "
            f"{alias!r}; its aliases: {have}. Pick one with --alias"
        )
    return ModelVersionToServe(pipeline, name, alias, str(aliases[alias]), uri)


def _check_store(uri: str, pipeline: str) -> None:
    """Fail in seconds on a tracking server that does not answer, and on a local store that is
    not there (MLflow would create an empty one, then find no model in it)."""
    if uri.startswith(("http://", "https://")):
        try:
            mlflow_runs.check_reachable(uri)
        except mlflow_runs.TrackingUnavailableError as error:
            raise ServingError(str(error)) from None
        return
    path = _local_store_path(uri)
    if path is not None and not path.exists():
        raise ServingError(
            f"no MLflow tracking store at {path} ({locations.TRACKING_URI_ENV}={uri}): nothing "
            f"was tracked there yet; train the pipeline first (`stratoflow run {pipeline}`) or "
            f"point {locations.TRACKING_URI_ENV} at the store or server that has its model"
        )


def _local_store_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///"))
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri and ":" not in uri.split("/")[0]:
        return Path(uri)  # a plain folder: MLflow's file store
    return None


def _refusal(uri: str, name: str, error: Any) -> str:
    message = str(getattr(error, "message", error)).strip().splitlines()[0]
    if error.error_code in ("PERMISSION_DENIED", "UNAUTHENTICATED") or " 401" in message:
        return (
            f"MLflow at {uri} refused registered model {name!r} ({message}); set "
            f"{CREDENTIAL_ENV[0]} and {CREDENTIAL_ENV[1]} to a user that may read it"
        )
    return f"MLflow at {uri} could not give registered model {name!r}: {message}"


def download_model(model: ModelVersionToServe, folder: Path) -> Path:
    """Copy the version's files (MLmodel, the Keras file, the serving loader) into `folder`.

    Returns:
        The copy's path, what the scoring server loads.

    Raises:
        ServingError: MLflow refused or failed to give the files (the message says which).
    """
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    try:
        path = mlflow.artifacts.download_artifacts(
            artifact_uri=model.uri, dst_path=str(folder), tracking_uri=model.tracking_uri
        )
    except MlflowException as error:
        raise ServingError(_refusal(model.tracking_uri, model.registered_model, error)) from None
    logger.info("copied %s (alias %s) to %s", model.uri, model.alias, path)
    return Path(path)


def scoring_server_command(
    model_dir: Path, port: int, workers: int
) -> tuple[list[str], dict[str, str]]:
    """What `mlflow models serve --env-manager local` runs, bound to loopback, for `model_dir`.

    The command line is MLflow's own (`scoring_server.get_cmd`), its `uvicorn` this interpreter's
    (the virtualenv's `bin/` is also put first on PATH: MLflow's command names a bare `uvicorn`).
    The environment is this process's without the MLflow credentials.

    Returns:
        The argv and the environment of the scoring server.
    """
    from mlflow.pyfunc import scoring_server

    # MLflow annotates `host` as int; it is the address string `uvicorn --host` takes.
    command, env = scoring_server.get_cmd(str(model_dir), port, HOST, None, workers)  # type: ignore[arg-type]
    argv = shlex.split(command)
    bin_dir = Path(sys.executable).parent  # not resolved: the venv's bin/, not the base Python's
    if argv[0] == "uvicorn":
        argv[0] = str(bin_dir / "uvicorn")
    # uvicorn kills a worker that has not answered its health check in 5 s, and a worker that
    # imports TensorFlow holds the GIL longer than that: with several workers, every one was
    # killed and restarted over and over.
    argv[1:1] = ["--timeout-worker-healthcheck", str(WORKER_HEALTHCHECK_SECONDS)]
    env = {key: value for key, value in env.items() if key not in CREDENTIAL_ENV}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", os.defpath)])
    return argv, env


@dataclass(frozen=True)
class Usage:
    """How to call a served model: an example request body (inline or a file) and its answer."""

    input_format: str  # the request's key: `dataframe_split` (a table) or `inputs` (arrays)
    example: str | None  # a one-row JSON request, when short enough to print
    example_file: Path | None  # else (or without an example) a file holding one
    answer_columns: list[str]
    input_description: str


def usage(model_dir: Path) -> Usage:
    """What a request to the served model looks like, from the copy's signature and example."""
    from mlflow.models import Model

    meta = Model.load(str(model_dir))
    signature = meta.signature
    inputs = signature.inputs if signature is not None else None
    outputs = [] if signature is None else (signature.outputs.input_names() or [])
    tabular = inputs is not None and not inputs.is_tensor_spec()
    info = meta.saved_input_example_info or {}
    file = model_dir / info["serving_input_path"] if info.get("serving_input_path") else None
    example = None
    if file is not None and file.is_file():
        payload = json.loads(file.read_text())
        if tabular and "dataframe_split" in payload:
            split = payload["dataframe_split"]
            one_row = {"dataframe_split": {"columns": split["columns"], "data": split["data"][:1]}}
            text = json.dumps(one_row, separators=(",", ":"))
            example = text if len(text) <= INLINE_EXAMPLE_CHARS else None
    if inputs is None:
        description = "what the model's python_function takes (it has no signature)"
    elif tabular:
        description = "a table (`dataframe_split`) with the columns " + ", ".join(
            str(name) for name in inputs.input_names()
        )
    else:
        spec = inputs.inputs[0]
        shape = "×".join("N" if size == -1 else str(size) for size in spec.shape)
        description = (
            f"`inputs`: an array of {shape} {spec.type}, after the pipeline's preprocessing"
        )
    return Usage(
        input_format="dataframe_split" if tabular else "inputs",
        example=example,
        example_file=None if example is not None else file,
        answer_columns=[str(name) for name in outputs],
        input_description=description,
    )
