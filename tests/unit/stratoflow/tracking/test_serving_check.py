"""The serving check: a registered version answered in a fresh process, compared with the
evaluated model's outputs (the comparison on its own; the fresh process against a real SQLite
registry)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid

import numpy as np
import pytest

from stratoflow.config.features import Features, Target
from stratoflow.tracking import serving_check

DIGITS = Target("classification", class_names=tuple(str(k) for k in range(10)))


def served_rows(probabilities: np.ndarray, names: tuple[str, ...]) -> dict:
    return {
        "predictions": [
            {f"probability_{n}": float(p) for n, p in zip(names, row, strict=True)}
            | {"predicted_class": names[int(row.argmax())], "predicted_class_id": int(row.argmax())}
            for row in probabilities
        ]
    }


def test_answers_within_the_tolerance_pass_and_beyond_it_fail_naming_the_example():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    target = Target("classification", class_names=("a", "b", "c"))
    probabilities = serving_check.expected_answers(logits, target)
    passed, reason, largest = serving_check.compare_answers(
        served_rows(probabilities + 5e-5, target.class_names), logits, target
    )
    assert passed and largest == pytest.approx(5e-5), reason
    off = probabilities.copy()
    off[1] = [0.5, 0.25, 0.25]
    passed, reason, _ = serving_check.compare_answers(
        served_rows(off, ("a", "b", "c")), logits, target
    )
    assert not passed
    assert "differ from the evaluated model's on 1 of 2 test examples" in reason
    assert "first: example 1, probability_a 0.5 served" in reason


def test_a_regression_answer_is_compared_relative_to_its_scale_and_must_have_every_row():
    outputs = np.array([[150.0], [0.2]])
    target = Target("regression")
    near = {"predictions": [{"prediction": 150.01}, {"prediction": 0.20005}]}
    assert serving_check.compare_answers(near, outputs, target)[0]
    far = {"predictions": [{"prediction": 150.1}, {"prediction": 0.2}]}
    assert not serving_check.compare_answers(far, outputs, target)[0]
    short = {"predictions": [{"prediction": 150.0}]}
    passed, reason, _ = serving_check.compare_answers(short, outputs, target)
    assert not passed and reason == "the served version answered 1 rows for 2 examples"


def test_the_request_is_what_a_client_sends_the_scoring_server():
    table = {"island": np.array([0, 2]), "mass": np.array([0.5, -1.0], dtype="float32")}
    assert json.loads(serving_check.request_body(table)) == {
        "dataframe_split": {"columns": ["island", "mass"], "data": [[0, 0.5], [2, -1.0]]}
    }
    images = np.zeros((2, 8, 8, 1), dtype="float32")
    assert np.asarray(json.loads(serving_check.request_body(images))["inputs"]).shape == (
        2,
        8,
        8,
        1,
    )


@pytest.fixture(scope="module")
def served(tf_runtime):
    """An MLP logged and registered as a version, its outputs on the test images as evaluated,
    and what a fresh process serving the version answered for them."""
    from stratoflow.config.spec import load_spec
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, model_registry
    from stratoflow.training import recorded_outputs
    from stratoflow.training.models import mlp

    reference = datasets.prepare_dataset(load_spec("digits").dataset)
    images, labels = datasets.load_arrays(reference, "test")
    images, labels = (
        images[: recorded_outputs.EXAMPLES],
        labels[: recorded_outputs.EXAMPLES],
    )
    model = mlp(Features("image", shape=(8, 8, 1)), DIGITS, hidden_units=[16])
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/model.keras"
        model.save(path)
        run_id = mlflow_runs.start_or_resume_run(
            load_spec("digits"),
            "retrain_digits",
            f"manual__{uuid.uuid4().hex}",
            1,
            reference.to_dict(),
        )
        # As the training process records it: the tasks log and check from this.
        recorded = recorded_outputs.score(path, images, labels)
        uri = model_registry.log_model(run_id, path, recorded, DIGITS)
        outputs = recorded.example_outputs()
    name = f"serving-check-{uuid.uuid4().hex[:8]}"
    version = model_registry.register(name, run_id, uri, promote=False, tags={}).version
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    answer, failure = serving_check.serve_in_fresh_process(
        f"models:/{name}/{version}", images, environment
    )
    assert answer is not None, failure
    return outputs, answer


@pytest.mark.integration
def test_a_version_served_in_a_fresh_process_answers_as_evaluated(served):
    outputs, answer = served
    passed, reason, largest = serving_check.compare_answers(answer, outputs, DIGITS)
    assert passed, reason
    assert largest is not None and largest < 1e-5
    assert reason.startswith(f"{len(outputs)} test examples answered as evaluated")


@pytest.mark.integration
def test_answers_that_differ_from_the_evaluated_ones_fail_the_check(served):
    """The same served answers, against outputs the served model does not give (one class's
    logit raised): what a model whose served behaviour changed shows. A version the fresh
    process cannot load: `tests/integration/test_promotion_checks.py`."""
    outputs, answer = served
    changed = outputs.copy()
    changed[:, 3] += 2.0
    passed, reason, _ = serving_check.compare_answers(answer, changed, DIGITS)
    assert not passed
    assert f"served class probabilities differ from the evaluated model's on {len(outputs)} of" in (
        reason
    )


def test_a_fresh_process_started_ahead_and_not_asked_is_ended_with_its_folder():
    """The registration task starts the check's process before it logs the version; when no
    check follows (the logging failed), closing it leaves no process and no folder behind."""
    fresh = serving_check.start_fresh_process(dict(os.environ))
    assert fresh.process.poll() is None  # importing, or waiting for its request
    fresh.close()
    assert fresh.process.returncode is not None
    assert not fresh.work.exists()
