"""MLflow tracking and registry against a real SQLite store (the session's)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from stratoflow.config.features import Features, Target
from stratoflow.config.spec import load_spec

DIGITS = Target("classification", class_names=tuple(str(k) for k in range(10)))


@pytest.fixture(scope="module")
def digits_ref(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    return prepare_dataset(load_spec("digits").dataset).to_dict()


@pytest.fixture(scope="module")
def saved_model(tf_runtime, tmp_path_factory):
    from stratoflow.training.models import mlp

    path = tmp_path_factory.mktemp("model") / "model.keras"
    mlp(Features("image", shape=(8, 8, 1)), DIGITS, hidden_units=[8]).save(path)
    return str(path)


def recorded(saved_model: str, examples: np.ndarray):
    """What a training process records of `saved_model` on `examples` (all of class 0)."""
    from stratoflow.training import recorded_outputs

    return recorded_outputs.score(saved_model, examples, np.zeros(len(examples), "int64"))


def new_run(digits_ref) -> str:
    from stratoflow.tracking import mlflow_runs

    return mlflow_runs.start_or_resume_run(
        load_spec("digits"), "retrain_digits", f"manual__{uuid.uuid4().hex}", 1, digits_ref
    )


def test_a_retried_task_reuses_the_run_of_its_dag_run(digits_ref):
    from stratoflow.tracking import mlflow_runs

    spec = load_spec("digits")
    dag_run = f"manual__{uuid.uuid4().hex}"
    first = mlflow_runs.start_or_resume_run(spec, "retrain_digits", dag_run, 1, digits_ref)
    second = mlflow_runs.start_or_resume_run(spec, "retrain_digits", dag_run, 2, digits_ref)
    assert first == second
    run = mlflow_runs.client().get_run(first)
    assert run.data.tags["airflow.run_id"] == dag_run
    assert run.data.tags["airflow.try_number"] == "2"
    assert run.data.tags["strategy"] == "one_device"
    assert run.data.tags["dataset"] == "stratoflow_digits:1.0.0"
    assert run.data.params["training.batch_size"] == "32"
    assert run.data.params["model.hyperparameters.hidden_units"] == "[128, 64]"
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["stratoflow_digits:1.0.0"]


def test_each_epoch_is_logged_once_even_when_logged_again(digits_ref):
    from stratoflow.config import locations
    from stratoflow.tracking import mlflow_runs

    run_id = new_run(digits_ref)
    epoch = {"epoch": 1, "loss": 1.0, "accuracy": 0.5, "val_loss": 1.1, "val_accuracy": 0.4}
    epoch |= {"examples_per_second": 100.0}
    mlflow_runs.EpochLogger(locations.tracking_uri(), run_id)(epoch)
    # A retry's logger starts from what MLflow already holds.
    retry = mlflow_runs.EpochLogger(locations.tracking_uri(), run_id)
    retry.log_missing([epoch, {**epoch, "epoch": 2, "loss": 0.8}])
    history = mlflow_runs.client().get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.8)]


def test_registration_is_idempotent_and_champion_moves_only_on_promote(digits_ref, saved_model):
    from stratoflow.tracking import mlflow_runs, model_registry

    name = f"test-model-{uuid.uuid4().hex[:8]}"
    example = recorded(saved_model, np.zeros((2, 8, 8, 1), dtype="float32"))
    first_run, second_run = new_run(digits_ref), new_run(digits_ref)
    first_uri = model_registry.log_model(first_run, saved_model, example, DIGITS)
    assert (
        model_registry.log_model(first_run, saved_model, example, DIGITS) == first_uri
    )  # logged once
    first = model_registry.register(name, first_run, first_uri, promote=True, tags={})
    assert (first.version, first.aliases) == ("1", ["challenger", "champion"])

    second_uri = model_registry.log_model(second_run, saved_model, example, DIGITS)
    second = model_registry.register(name, second_run, second_uri, promote=False, tags={})
    again = model_registry.register(name, second_run, second_uri, promote=False, tags={})
    assert second.version == again.version == "2"
    assert second.aliases == ["challenger"]
    assert model_registry.alias_targets(mlflow_runs.client(), name) == {
        "champion": "1",
        "challenger": "2",
    }
    assert len(mlflow_runs.client().search_model_versions(f"name = '{name}'")) == 2

    import mlflow

    info = mlflow.models.get_model_info(first_uri)
    assert "keras" in info.flavors
    # The served model answers with class probabilities and the predicted class.
    answer = mlflow.pyfunc.load_model(first_uri).predict(example.examples)
    assert list(answer.columns) == [
        *(f"probability_{k}" for k in range(10)),
        "predicted_class",
        "predicted_class_id",
    ]
    assert np.allclose(answer.filter(like="probability_").sum(axis=1), 1.0, atol=1e-5)
    assert info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"] == (-1, 8, 8, 1)
    assert info.saved_input_example_info is not None


def test_a_failed_registration_leaves_no_version_and_restores_aliases(digits_ref, saved_model):
    from mlflow.exceptions import MlflowException

    from stratoflow.tracking import mlflow_runs, model_registry

    name = f"test-model-{uuid.uuid4().hex[:8]}"
    example = recorded(saved_model, np.zeros((2, 8, 8, 1), dtype="float32"))
    good_run = new_run(digits_ref)
    model_registry.register(
        name, good_run, model_registry.log_model(good_run, saved_model, example, DIGITS), True, {}
    )
    other_uri = model_registry.log_model(new_run(digits_ref), saved_model, example, DIGITS)
    # A run id the store does not know: the version is created, then tagging the run fails.
    with pytest.raises(MlflowException, match=f"Run with id={'0' * 32} not found") as error:
        model_registry.register(name, "0" * 32, other_uri, promote=True, tags={})
    assert error.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    mlflow_client = mlflow_runs.client()
    assert [str(v.version) for v in mlflow_client.search_model_versions(f"name = '{name}'")] == [
        "1"
    ]
    assert model_registry.alias_targets(mlflow_client, name) == {"champion": "1", "challenger": "1"}


def test_champion_moves_after_registration_and_a_withdrawn_one_goes_back(digits_ref, saved_model):
    """What `log_and_register` does around the serving check: register as challenger, then
    promote; a check that fails on a retry, after an earlier try promoted the version, gives
    champion back to the version it named before."""
    from stratoflow.tracking import mlflow_runs, model_registry

    name = f"test-model-{uuid.uuid4().hex[:8]}"
    example = recorded(saved_model, np.zeros((2, 8, 8, 1), dtype="float32"))
    versions = []
    for _ in range(2):
        run_id = new_run(digits_ref)
        uri = model_registry.log_model(run_id, saved_model, example, DIGITS)
        versions.append(model_registry.register(name, run_id, uri, promote=False, tags={}))
    client = mlflow_runs.client()
    assert model_registry.alias_targets(client, name) == {"challenger": "2"}
    assert model_registry.promote(name, "1") == ["champion"]
    assert model_registry.withdraw_champion(name, "2") == ["challenger"]  # not its: unchanged
    assert model_registry.alias_targets(client, name) == {"challenger": "2", "champion": "1"}
    assert model_registry.promote(name, "2") == ["challenger", "champion"]
    assert model_registry.withdraw_champion(name, "2") == ["challenger"]
    assert model_registry.alias_targets(client, name) == {"challenger": "2", "champion": "1"}
    assert model_registry.withdraw_champion(name, "1") == []  # it named none before: removed
    assert model_registry.alias_targets(client, name) == {"challenger": "2"}


def test_champion_reads_the_champion_runs_test_accuracy(digits_ref, saved_model):
    from stratoflow.tracking import mlflow_runs, model_registry

    name = f"test-model-{uuid.uuid4().hex[:8]}"
    assert mlflow_runs.champion(name) is None
    run_id = new_run(digits_ref)
    mlflow_runs.log_metrics(run_id, {"test_accuracy": 0.97})
    uri = model_registry.log_model(
        run_id, saved_model, recorded(saved_model, np.zeros((1, 8, 8, 1), "float32")), DIGITS
    )
    model_registry.register(name, run_id, uri, promote=True, tags={})
    assert mlflow_runs.champion(name) == ("1", pytest.approx(0.97))


def test_a_table_logged_again_is_replaced_not_appended(digits_ref):
    """A retried evaluate task logs the per-class table again: MLflow alone would append."""
    import json

    from stratoflow.tracking import mlflow_runs

    run_id = new_run(digits_ref)
    mlflow_runs.log_table(run_id, {"class": [0, 1], "recall": [0.5, 0.75]}, "evaluation/t.json")
    mlflow_runs.log_table(run_id, {"class": [0, 1], "recall": [0.5, 1.0]}, "evaluation/t.json")
    text = mlflow_runs.client().download_artifacts(run_id, "evaluation/t.json")
    with open(text) as handle:
        table = json.load(handle)
    assert table == {"columns": ["class", "recall"], "data": [[0, 0.5], [1, 1.0]]}


def test_deleting_a_failed_runs_version_gives_champion_back_to_the_previous_one(
    digits_ref, saved_model
):
    """A run promoted in log_and_register that then fails for good must not leave no champion."""
    from stratoflow.tracking import mlflow_runs, model_registry

    name = f"test-model-{uuid.uuid4().hex[:8]}"
    example = recorded(saved_model, np.zeros((2, 8, 8, 1), dtype="float32"))
    runs = [new_run(digits_ref) for _ in range(3)]
    uris = [model_registry.log_model(run, saved_model, example, DIGITS) for run in runs]
    model_registry.register(name, runs[0], uris[0], promote=True, tags={})
    model_registry.register(name, runs[1], uris[1], promote=False, tags={})
    model_registry.register(name, runs[2], uris[2], promote=True, tags={})
    mlflow_client = mlflow_runs.client()
    assert model_registry.alias_targets(mlflow_client, name) == {"champion": "3", "challenger": "3"}

    assert model_registry.delete_versions_of_run(name, runs[2]) == ["3"]
    assert model_registry.alias_targets(mlflow_client, name) == {"champion": "1", "challenger": "2"}
    assert model_registry.delete_versions_of_run(name, runs[1]) == ["2"]
    assert model_registry.alias_targets(mlflow_client, name) == {"champion": "1", "challenger": "1"}
    # The first version had nothing before it: its aliases are simply gone.
    assert model_registry.delete_versions_of_run(name, runs[0]) == ["1"]
    assert model_registry.alias_targets(mlflow_client, name) == {}
