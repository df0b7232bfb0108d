"""The model registry step: log the trained model to the run, add a version, move aliases.

Idempotent per DAG run (a retried task reuses the logged model and the version it finds by run
id) and all-or-nothing: if anything fails after a version was created, the version is deleted and
the aliases are put back where they were. Each version remembers, in tags, where the aliases it
took pointed before, so a run that fails later (in a later task, or for good after retries) and
has its version deleted puts `champion` back on the previous champion instead of leaving none.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from stratoflow.config import names
from stratoflow.config.features import Target
from stratoflow.tracking import keras_model_folder, mlflow_runs, serving_loader

logger = logging.getLogger(__name__)


@dataclass
class RegistrationResult:
    registered_model: str
    version: str
    model_uri: str
    aliases: list[str]
    promoted: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_version_of_run(mlflow_client: Any, model_name: str, run_id: str) -> Any | None:
    versions = mlflow_client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    return versions[0] if versions else None


def log_model(run_id: str, model_path: str, recorded: Any, target: Target) -> str:
    """Log the Keras model once per run: `keras` flavor, and a `python_function` that answers as
    users expect (`stratoflow.tracking.serving_loader`), with its signature and input example.

    Nothing here loads the model: the folder is written around the saved file
    (`keras_model_folder`), and the signature is taken from the outputs the training process
    recorded.

    Args:
        run_id: the run's MLflow run.
        model_path: the saved Keras model.
        recorded: what the training process recorded of it
            (`stratoflow.training.recorded_outputs.RecordedOutputs`): its first test examples
            (the first two are the input example), its outputs on them and the TensorFlow and
            Keras builds it trained with.
        target: what the model predicts (task, class names).
    """
    import mlflow
    from mlflow.models import infer_signature

    mlflow_client = mlflow_runs.client()
    existing = mlflow_client.get_run(run_id).data.tags.get(names.MODEL_URI_TAG)
    if existing:
        logger.info("model already logged for run %s: %s", run_id, existing)
        return str(existing)
    config = _serving_config(recorded.examples, target)
    input_example = _input_example(recorded.examples)
    served = serving_loader.ServedModel(_RecordedAnswers(recorded.outputs[:2]), config)
    signature = infer_signature(input_example, served.predict(input_example))
    # The builds that trained it (a GPU host's `tensorflow` serves on CPUs too).
    requirements = [*recorded.requirements(), f"mlflow=={mlflow.__version__}"]
    # An explicit `pip_requirements` skips MLflow's requirement inference (tens of seconds).
    # MLflow's check of the input example would load the model here: the serving check does it
    # in a fresh process instead (`stratoflow.tracking.serving_check`).
    with mlflow.start_run(run_id=run_id):
        info = mlflow.models.Model.log(
            artifact_path=None,
            name="model",
            flavor=keras_model_folder.flavor(recorded.versions["keras"], config),
            model=model_path,
            signature=signature,
            input_example=input_example,
            pip_requirements=requirements,
            validate_serving_input=False,
        )
    mlflow_client.update_run(run_id, status="RUNNING")  # the run ends with the DAG run, not here
    mlflow_client.set_tag(run_id, names.MODEL_URI_TAG, info.model_uri)
    return str(info.model_uri)


class _RecordedAnswers:
    """The model's outputs on the input example, as the training process recorded them: what
    `serving_loader.ServedModel` turns into the served answers of the signature."""

    def __init__(self, outputs: Any):
        self.outputs = outputs

    def predict(self, inputs: Any, verbose: int = 0) -> Any:
        del inputs, verbose
        return self.outputs


def _serving_config(features: Any, target: Target) -> dict[str, Any]:
    columns = []
    if isinstance(features, dict):
        columns = [
            {"name": name, "kind": "categorical" if values.dtype.kind in "iu" else "numeric"}
            for name, values in features.items()
        ]
    return {
        "task": target.task,
        "class_names": list(target.class_names),
        "columns": columns,
        "shape": [] if columns else list(features.shape[1:]),
    }


def _input_example(features: Any) -> Any:
    """The first two examples: a DataFrame of the columns (tabular) or an array (images)."""
    if isinstance(features, dict):
        import pandas as pd

        return pd.DataFrame({name: values[:2] for name, values in features.items()})
    return features[:2]


def register(
    model_name: str,
    run_id: str,
    model_uri: str,
    promote: bool,
    tags: dict[str, str],
) -> RegistrationResult:
    """Add (or find) this run's version of `model_name`; alias it challenger, champion if `promote`.

    Raises:
        Exception: whatever failed; a version created by this call is deleted first and the
            aliases restored.
    """
    import mlflow

    mlflow_client = mlflow_runs.client()
    previous_aliases = alias_targets(mlflow_client, model_name)
    existing = find_version_of_run(mlflow_client, model_name, run_id)
    created = existing is None
    version = existing or mlflow.register_model(model_uri, model_name, tags=tags)
    if created:
        logger.info("registered %s version %s", model_name, version.version)
    moving = [names.CHALLENGER, *([names.CHAMPION] if promote else [])]
    try:
        _move_aliases(mlflow_client, model_name, str(version.version), moving, previous_aliases)
        mlflow_client.set_tag(run_id, names.VERSION_TAG, version.version)
    except Exception:
        if created:
            _roll_back(mlflow_client, model_name, version.version, previous_aliases)
        raise
    aliases = mlflow_client.get_model_version(model_name, version.version).aliases
    return RegistrationResult(
        registered_model=model_name,
        version=str(version.version),
        model_uri=model_uri,
        aliases=sorted(aliases),
        promoted=promote,
    )


def promote(model_name: str, version: str) -> list[str]:
    """Move `champion` to `version` (already registered), remembering where it pointed before.

    Returns:
        The version's aliases afterwards.
    """
    mlflow_client = mlflow_runs.client()
    previous_aliases = alias_targets(mlflow_client, model_name)
    _move_aliases(mlflow_client, model_name, version, [names.CHAMPION], previous_aliases)
    return sorted(mlflow_client.get_model_version(model_name, version).aliases)


def withdraw_champion(model_name: str, version: str) -> list[str]:
    """Give `champion` back to the version it named before `version` took it, if `version`
    holds it (an earlier try of the same run promoted it); remove it if it named none.

    Returns:
        The version's aliases afterwards.
    """
    mlflow_client = mlflow_runs.client()
    if alias_targets(mlflow_client, model_name).get(names.CHAMPION) == version:
        tags = mlflow_client.get_model_version(model_name, version).tags
        previous = tags.get(names.PREVIOUS_ALIAS_TAG + names.CHAMPION)
        if previous:
            _give_back(mlflow_client, model_name, names.CHAMPION, previous)
        else:
            mlflow_client.delete_registered_model_alias(model_name, names.CHAMPION)
    return sorted(mlflow_client.get_model_version(model_name, version).aliases)


def _move_aliases(
    mlflow_client: Any,
    model_name: str,
    version: str,
    aliases: list[str],
    previous_aliases: dict[str, str],
) -> None:
    for alias in aliases:
        previous = previous_aliases.get(alias, "")
        if previous != version:  # a retry finds its own version there already
            mlflow_client.set_model_version_tag(
                model_name, version, names.PREVIOUS_ALIAS_TAG + alias, previous
            )
        mlflow_client.set_registered_model_alias(model_name, alias, version)


def delete_versions_of_run(model_name: str, run_id: str) -> list[str]:
    """Remove every version a (failed) run registered and give its aliases back.

    An alias the deleted version held goes back to the version it named before (recorded by
    `register`), if that version still exists; so a run that was promoted and then failed leaves
    the previous champion serving, not a model without a champion.

    Returns:
        The deleted version numbers.
    """
    mlflow_client = mlflow_runs.client()
    try:
        versions = mlflow_client.search_model_versions(
            f"name = '{model_name}' and run_id = '{run_id}'"
        )
    except Exception:
        return []
    for version in versions:
        number = str(version.version)
        held = [a for a, v in alias_targets(mlflow_client, model_name).items() if v == number]
        tags = mlflow_client.get_model_version(model_name, number).tags
        mlflow_client.delete_model_version(model_name, number)
        logger.info("deleted %s version %s of failed run %s", model_name, number, run_id)
        for alias in held:
            _give_back(mlflow_client, model_name, alias, tags.get(names.PREVIOUS_ALIAS_TAG + alias))
    return [str(version.version) for version in versions]


def _give_back(mlflow_client: Any, model_name: str, alias: str, previous: str | None) -> None:
    if not previous:
        return  # the alias named no version before: it stays unset
    try:
        mlflow_client.get_model_version(model_name, previous)
    except Exception:
        logger.warning(
            "%s: %s cannot go back to version %s, which is gone", model_name, alias, previous
        )
        return
    mlflow_client.set_registered_model_alias(model_name, alias, previous)
    logger.info("%s: %s is version %s again", model_name, alias, previous)


def alias_targets(mlflow_client: Any, model_name: str) -> dict[str, str]:
    """Alias → version number (as a string) of a registered model; empty if it does not exist."""
    try:
        aliases = mlflow_client.get_registered_model(model_name).aliases
    except Exception:  # the model does not exist yet
        return {}
    return {alias: str(version) for alias, version in aliases.items()}


def _roll_back(
    mlflow_client: Any, model_name: str, version: str, previous_aliases: dict[str, str]
) -> None:
    logger.warning("rolling back %s version %s", model_name, version)
    mlflow_client.delete_model_version(model_name, version)
    for alias, target in previous_aliases.items():
        mlflow_client.set_registered_model_alias(model_name, alias, target)


def move_alias(model_name: str, version: str, alias: str) -> None:
    """Point `alias` at `version`, remembering on the version where it pointed before.

    As `register` does: a run that fails later and has its version deleted gives the alias
    back (`delete_versions_of_run`).
    """
    mlflow_client = mlflow_runs.client()
    previous = alias_targets(mlflow_client, model_name).get(alias, "")
    if previous != version:  # a retry finds its own version there already
        mlflow_client.set_model_version_tag(
            model_name, version, names.PREVIOUS_ALIAS_TAG + alias, previous
        )
    mlflow_client.set_registered_model_alias(model_name, alias, version)
