"""What stands between a challenger and `champion` beyond its overall test metrics, on real runs
of digits' evaluation and registration tasks (real Keras models, a fresh SQLite MLflow store, a
real fresh serving process):

- the gate's slices: a challenger trained with one class's labels corrupted scores well overall
  but not on that class; it is not promoted, and the report names the class;
- the serving check: a challenger whose registered version a fresh process cannot load (a layer
  only the training process knew) passes the gate but is not promoted, with the reason on the
  version and the run.

The models are trained in this process with Keras `fit` on digits' training split (seconds each);
the tasks score, gate, log, register and serve them as in a DAG run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from pathlib import Path

import numpy as np
import pytest

from stratoflow.config import names
from stratoflow.tasks.run_context import AirflowRun
from tests.conftest import fresh_mlflow_client

pytestmark = pytest.mark.integration

CORRUPTED_CLASS = 3


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    yield from fresh_mlflow_client(tmp_path_factory, "promotion-checks")


@pytest.fixture(scope="module")
def digits(tf_runtime, mlflow_client):
    """digits prepared, its plan, and its training split."""
    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data import datasets

    plan = resolve_plan("digits", {})
    reference = datasets.prepare_dataset(plan.spec.dataset)
    images, labels = datasets.load_arrays(reference, "train")
    return plan, reference, images, labels


def trained_model(digits, folder: Path, labels=None, wrap=None) -> str:
    """digits' MLP trained with Keras `fit` (on `labels` if given), optionally wrapped; saved."""
    import keras

    from stratoflow.training.models import mlp

    plan, reference, images, train_labels = digits
    keras.utils.set_random_seed(7)
    model = mlp(reference.features, reference.target, hidden_units=[64])
    model.compile(
        optimizer=keras.optimizers.Adam(0.003),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        images, train_labels if labels is None else labels, epochs=25, batch_size=32, verbose=0
    )
    if wrap is not None:
        model = wrap(model)
    path = folder / "model.keras"
    model.save(path)
    return str(path)


def evaluate_and_register(digits, model_path: str, plan=None):
    """The evaluation and registration tasks of one new DAG run on `model_path`, through JSON
    (under `plan`, default digits' own)."""
    from stratoflow.tasks import evaluate, register
    from stratoflow.tasks.prepare import PreparedDataset
    from stratoflow.tasks.train import TrainedModel
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training import recorded_outputs

    plan, reference, *_ = digits if plan is None else (plan, *digits[1:])
    run = AirflowRun(dag_id="retrain_digits", run_id=f"manual__{uuid.uuid4().hex[:12]}")
    run_id = mlflow_runs.start_or_resume_run(
        plan.spec, run.dag_id, run.run_id, 1, reference.to_dict()
    )
    prepared = PreparedDataset(dataset=reference, mlflow_run_id=run_id, plan=plan)
    # What the training process records after saving the model: the tasks score from it.
    recorded = recorded_outputs.record(plan.spec, reference, model_path, Path(model_path).parent)
    trained = TrainedModel(run_id, model_path, 1, 1, 25, 0, {}, str(recorded))
    evaluated = evaluate.evaluate(run, prepared, trained)
    evaluated = type(evaluated).from_dict(json.loads(json.dumps(evaluated.to_dict())))
    registered = register.log_and_register(run, prepared, trained, evaluated)
    return evaluated, registered


@pytest.fixture(scope="module")
def champion(digits, tmp_path_factory):
    evaluated, registered = evaluate_and_register(
        digits, trained_model(digits, tmp_path_factory.mktemp("champion"))
    )
    assert evaluated.gate.passed, evaluated.gate.reasons
    assert registered.aliases == ["challenger", "champion"]
    return evaluated, registered


def test_the_champion_was_served_in_a_fresh_process_before_it_was_promoted(champion, mlflow_client):
    evaluated, registered = champion
    version = mlflow_client.get_model_version("stratoflow-digits", registered.version)
    assert version.tags[names.SERVING_CHECK_TAG].startswith(
        "passed: 179 test examples answered as evaluated"
    )
    run = mlflow_client.get_run(registered.mlflow_run_id)
    assert run.data.tags[names.SERVING_CHECK_TAG] == version.tags[names.SERVING_CHECK_TAG]
    seconds = run.data.metrics[names.SERVING_CHECK_SECONDS_METRIC]
    logging.getLogger(__name__).info("serving check: %.1f s", seconds)
    # Every class's accuracy is in the champion's run, where the next run's gate reads it.
    for label in range(10):
        assert f"test_slice/class_{label}/accuracy" in run.data.metrics


def test_a_challenger_worse_on_one_class_is_not_promoted_and_the_report_names_it(
    digits, champion, mlflow_client, tmp_path, caplog
):
    """Under a gate whose whole-split bound is lenient (accuracy >= 0.8, at most 0.15 below the
    champion), which one bad class of ten does not cross: only its slice fails it."""
    from stratoflow.config.evaluation_spec import EvaluationGate, MetricBound, checked_gate
    from stratoflow.tracking import model_registry

    plan, _, _, labels = digits
    lenient = checked_gate(
        EvaluationGate(
            metrics=[MetricBound("test_accuracy", min=0.8, max_regression=0.15)],
            slices=plan.spec.evaluation.slices,
        ),
        "classification",
        "test",
    )
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, evaluation=lenient))
    # Class 3's training labels become 5: the model learns to call a 3 a 5.
    corrupted = np.where(labels == CORRUPTED_CLASS, 5, labels)
    with caplog.at_level(logging.INFO, logger="stratoflow.tasks.evaluate"):
        evaluated, registered = evaluate_and_register(
            digits, trained_model(digits, tmp_path, labels=corrupted), plan
        )
    gate = evaluated.gate
    assert not gate.passed
    assert [check.name for check in gate.failed_checks] == [f"class_{CORRUPTED_CLASS}"]
    (reason,) = gate.reasons
    assert reason.startswith(f"slice class_{CORRUPTED_CLASS} (class 3, 18 examples): accuracy ")
    assert f"is more than 0.1200 below champion version {champion[1].version}" in reason
    assert registered.aliases == ["challenger"] and not registered.promoted
    assert model_registry.alias_targets(mlflow_client, "stratoflow-digits")["champion"] == (
        champion[1].version
    )
    # The report: the task log line, the run's tags, its JSON and its table.
    assert any(f"gate failed: {reason}" in message for message in caplog.messages)
    run = mlflow_client.get_run(registered.mlflow_run_id)
    assert run.data.tags[names.GATE_PASSED_TAG] == "False"
    assert f"class_{CORRUPTED_CLASS}" in run.data.tags[names.GATE_FAILED_TAG].split("; ")
    folder = Path(mlflow_client.download_artifacts(run.info.run_id, "evaluation", str(tmp_path)))
    report = json.loads((folder / "gate.json").read_text())
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["class_3"]
    table = json.loads((folder / "gate_checks.json").read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    (row,) = [r for r in rows if r["check"] == f"slice class_{CORRUPTED_CLASS}"]
    assert row["passed"] is False and row["champion"] is not None
    # No serving check for a version that is not promoted anyway.
    assert names.SERVING_CHECK_TAG not in run.data.tags


def test_a_challenger_a_fresh_process_cannot_serve_is_not_promoted_and_says_why(
    digits, champion, mlflow_client, tmp_path
):
    from stratoflow.tracking import model_registry
    from tests.support.custom_layers import with_pass_through

    evaluated, registered = evaluate_and_register(
        digits, trained_model(digits, tmp_path, wrap=with_pass_through)
    )
    assert evaluated.gate.passed, evaluated.gate.reasons  # the same answers as the champion
    assert registered.aliases == ["challenger"] and not registered.promoted
    assert model_registry.alias_targets(mlflow_client, "stratoflow-digits")["champion"] == (
        champion[1].version
    )
    version = mlflow_client.get_model_version("stratoflow-digits", registered.version)
    reason = version.tags[names.SERVING_CHECK_TAG]
    assert reason.startswith("failed: the served version failed in a fresh process: ")
    assert "Could not locate class 'PassThrough'" in reason
    run = mlflow_client.get_run(registered.mlflow_run_id)
    assert run.data.tags[names.SERVING_CHECK_TAG] == reason
    assert run.info.status == "FINISHED"  # the run succeeded; its version is only a challenger
