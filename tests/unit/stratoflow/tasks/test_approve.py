"""`stratoflow.tasks.approve` on a real SQLite MLflow store: the approver's report, and what an
answer does.

The versions are registered without training (a run with test metrics, a version of it): what
is tested is the report and the aliases and tags an answer leaves, not a model.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from stratoflow.config import names
from stratoflow.config.promotion import APPROVE, REJECT, PromotionSpec
from stratoflow.config.spec import PipelineSpec, load_spec
from stratoflow.tasks import approve
from stratoflow.tasks.evaluate import Evaluation
from stratoflow.tasks.register import Registration
from stratoflow.tasks.run_context import AirflowRun
from stratoflow.training.evaluation import GateCheck, GateDecision
from tests.conftest import fresh_mlflow_client

RUN = AirflowRun(dag_id="retrain_digits", run_id="manual__approval")
CHAMPION_METRICS = {"test_accuracy": 0.90, "test_loss": 0.40}
CHALLENGER_METRICS = {"test_accuracy": 0.95, "test_loss": 0.30}


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from fresh_mlflow_client(tmp_path_factory, "approve-mlflow")  # type: ignore[misc]


@dataclasses.dataclass
class Versions:
    """A registered model whose version 1 is champion and version 2 the challenger to decide."""

    model: str
    registration: Registration
    evaluation: Evaluation


def _version_of_a_run(
    client: Any, experiment: str, model: str, metrics: dict[str, float]
) -> tuple[str, str]:
    run_id = client.create_run(experiment).info.run_id
    for key, value in metrics.items():
        client.log_metric(run_id, key, value)
    version = client.create_model_version(model, f"runs:/{run_id}/model", run_id=run_id)
    return run_id, str(version.version)


@pytest.fixture
def versions(mlflow_client: Any) -> Versions:
    model = f"approve-{uuid.uuid4().hex[:8]}"
    mlflow_client.create_registered_model(model)
    experiment = mlflow_client.create_experiment(model)
    _, champion = _version_of_a_run(mlflow_client, experiment, model, CHAMPION_METRICS)
    mlflow_client.set_registered_model_alias(model, names.CHAMPION, champion)
    run_id, challenger = _version_of_a_run(mlflow_client, experiment, model, CHALLENGER_METRICS)
    mlflow_client.set_registered_model_alias(model, names.CHALLENGER, challenger)
    registration = Registration(
        registered_model=model,
        version=challenger,
        model_uri=f"runs:/{run_id}/model",
        aliases=[names.CHALLENGER],
        promoted=False,
        mlflow_run_id=run_id,
        serving_check="passed: 256 test examples answered as evaluated",
    )
    gate = GateDecision(True, ["test_accuracy 0.9500 >= 0.9"], champion, 0.90)
    return Versions(model, registration, Evaluation(run_id, CHALLENGER_METRICS, gate))


def _spec(**training: Any) -> PipelineSpec:
    spec = load_spec("digits")
    return dataclasses.replace(
        spec,
        promotion=PromotionSpec(approval="required", timeout="1h"),
        training=dataclasses.replace(spec.training, **training),
    )


def _aliases(client: Any, model: str) -> dict[str, str]:
    return {a: str(v) for a, v in client.get_registered_model(model).aliases.items()}


def test_the_report_shows_the_metrics_against_the_champions_and_the_gates_reasons(
    mlflow_client: Any, versions: Versions
) -> None:
    request = approve.approval_request(_spec(), versions.evaluation, versions.registration)
    assert request.needed and request.report is not None
    report = request.report
    assert report.subject == f"Promote {versions.model} version 2 to champion?"
    assert report.champion_version == "1"
    text = report.to_markdown()
    assert "| test_accuracy | 0.9500 | 0.9000 | 0.0500 |" in text
    assert "| test_loss | 0.3000 | 0.4000 | -0.1000 |" in text
    assert "- test_accuracy 0.9500 >= 0.9" in text  # the gate's reason
    assert "- rule: test_accuracy >= 0.9, at most 0.02 worse than the champion" in text
    # The same report, as data, is on the MLflow run for later.
    logged = mlflow_client.download_artifacts(
        versions.registration.mlflow_run_id, approve.REPORT_ARTIFACT
    )
    with open(logged) as stream:
        assert json.load(stream) == json.loads(json.dumps(report.to_dict()))


def test_a_new_section_plugs_into_the_report(
    mlflow_client: Any, versions: Versions, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drift(inputs: approve.ReportInputs) -> approve.ReportSection:
        return approve.ReportSection("Drift", ["feature", "psi"], [["pixel_3", 0.02]], ["fine"])

    monkeypatch.setattr(approve, "SECTION_BUILDERS", [*approve.SECTION_BUILDERS, drift])
    request = approve.approval_request(_spec(), versions.evaluation, versions.registration)
    assert request.report is not None
    assert request.report.to_dict()["sections"][-1] == {
        "title": "Drift",
        "columns": ["feature", "psi"],
        "rows": [["pixel_3", 0.02]],
        "notes": ["fine"],
    }
    assert request.report.to_markdown().endswith(
        "### Drift\n\n| feature | psi |\n|---|---|\n| pixel_3 | 0.0200 |\n\n- fine"
    )


def test_no_one_is_asked_when_the_gate_failed_or_promote_is_off(versions: Versions) -> None:
    failed = dataclasses.replace(versions.evaluation, gate=GateDecision(False, ["too low"]))
    request = approve.approval_request(_spec(), failed, versions.registration)
    assert (request.needed, request.reason) == (
        False,
        "the gate failed: champion stays where it is",
    )
    request = approve.approval_request(
        _spec(promote=False), versions.evaluation, versions.registration
    )
    assert not request.needed
    assert "promote setting is off" in request.reason


def test_no_one_is_asked_when_the_version_failed_its_serving_check(versions: Versions) -> None:
    unservable = dataclasses.replace(
        versions.registration, serving_check="failed: Could not locate class 'PassThrough'"
    )
    request = approve.approval_request(_spec(), versions.evaluation, unservable)
    assert not request.needed
    assert "serving check failed (failed: Could not locate class 'PassThrough')" in request.reason


def test_the_approver_sees_each_slice_the_serving_verdict_and_the_datas_drift(
    mlflow_client: Any, versions: Versions
) -> None:
    slice_check = GateCheck(
        kind="slice",
        name="class_3",
        description="class 3",
        metric="accuracy",
        value=0.8,
        higher_is_better=True,
        passed=False,
        max_regression=0.12,
        champion_value=0.95,
        examples=18,
    )
    gate = dataclasses.replace(versions.evaluation.gate, checks=[slice_check])
    evaluation = dataclasses.replace(versions.evaluation, gate=gate)
    mlflow_client.log_dict(
        versions.registration.mlflow_run_id,
        {
            "passed": True,
            "accepted_drift": True,
            "champion": "1",
            "notes": [],
            "anomalies": [
                {
                    "check": "drift",
                    "feature": "bill_length_mm",
                    "split": "train",
                    "message": "PSI 0.9",
                }
            ],
            "drift": [
                {
                    "feature": "bill_length_mm",
                    "distance": "psi",
                    "value": 0.9,
                    "bound": 0.25,
                    "drifted": True,
                }
            ],
        },
        names.DATA_GATE_ARTIFACT,
    )
    request = approve.approval_request(_spec(), evaluation, versions.registration)
    assert request.report is not None
    text = request.report.to_markdown()
    assert "| class_3 | accuracy | 0.8000 | 0.9500 |" in text and "| FAILED |" in text
    assert "### Served in a fresh process\n\n- passed: 256 test examples" in text
    assert "| bill_length_mm | psi | 0.9000 | 0.2500 |" in text
    assert "- anomalies were accepted for this run (accept_drift)" in text
    assert "- anomaly: drift: PSI 0.9" in text


def _answer(chosen: str, user: str | None) -> dict[str, Any]:
    """Airflow's answer (`HITLTriggerEventSuccessPayload`); no user when the timeout answered."""
    return {
        "chosen_options": [chosen],
        "params_input": {},
        "responded_at": "2026-12-06T20:00:00+00:00",
        "responded_by_user": {"id": "7", "name": user} if user else None,
    }


@pytest.mark.parametrize(
    ("answer", "outcome", "champion", "note"),
    [
        (
            _answer(APPROVE, "alice"),
            "approved",
            "2",
            "approved by alice: champion moved from 1 to 2",
        ),
        (_answer(REJECT, "bob"), "rejected", "1", "rejected by bob: champion stays 1"),
        (
            _answer(REJECT, None),
            "timed out",
            "1",
            "no answer before the timeout: champion stays 1",
        ),
    ],
    ids=["approved", "rejected", "timed-out"],
)
def test_only_an_approval_moves_champion_and_the_version_and_run_say_why(
    mlflow_client: Any,
    versions: Versions,
    answer: dict[str, Any],
    outcome: str,
    champion: str,
    note: str,
) -> None:
    decision = approve.decide(RUN, versions.registration, answer)
    assert (decision.outcome, decision.champion, decision.promoted) == (
        outcome,
        champion,
        outcome == "approved",
    )
    assert _aliases(mlflow_client, versions.model) == {"champion": champion, "challenger": "2"}
    version_tags = mlflow_client.get_model_version(versions.model, "2").tags
    run_tags = mlflow_client.get_run(versions.registration.mlflow_run_id).data.tags
    for tags in (version_tags, run_tags):
        assert tags[approve.DECISION_TAG] == outcome
        assert tags[approve.NOTE_TAG] == note
    # An approved version remembers the champion before it, to give it back if the run fails.
    if outcome == "approved":
        assert version_tags[names.PREVIOUS_ALIAS_TAG + names.CHAMPION] == "1"


def test_a_run_that_fails_after_its_approval_gives_champion_back(
    mlflow_client: Any, versions: Versions
) -> None:
    """`promote_champion` failing for good after the alias moved: the failed run's clean-up
    (`model_registry.delete_versions_of_run`) deletes its version and champion is 1 again."""
    from stratoflow.tracking import model_registry

    approve.decide(RUN, versions.registration, _answer(APPROVE, "alice"))
    assert _aliases(mlflow_client, versions.model)["champion"] == "2"
    model_registry.delete_versions_of_run(versions.model, versions.registration.mlflow_run_id)
    assert _aliases(mlflow_client, versions.model)["champion"] == "1"
