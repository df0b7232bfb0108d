"""`stratoflow/dags/approval.py`: a pipeline asking for approval gets the approval steps, the others
don't.

The test pipelines of `tests/support/pipelines/` (digits, with `promotion: {approval: required}`)
are parsed as Airflow parses them: a fresh DagBag in its own process.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from stratoflow.config import locations
from tests.unit.stratoflow.test_dags import HEAVY_MODULES, TASK_IDS, _parse

TEST_PIPELINES = locations.PROJECT_ROOT / "tests" / "support" / "pipelines"
APPROVAL_TASKS = ["approve_promotion", "promote_champion"]


@pytest.fixture(scope="module")
def parsed(session_home: Path) -> dict[str, Any]:
    return _parse(session_home, HEAVY_MODULES, STRATOFLOW_PIPELINES_PATH=str(TEST_PIPELINES))


def test_approval_adds_two_tasks_after_the_registration(parsed: dict[str, Any]) -> None:
    assert parsed["import_errors"] == {}
    dag = parsed["dags"]["retrain_digits_approval"]
    assert dag["task_order"] == TASK_IDS + APPROVAL_TASKS
    assert dag["upstream"]["approve_promotion"] == ["log_and_register"]
    assert dag["upstream"]["promote_champion"] == ["approve_promotion", "log_and_register"]
    # A person's answer is not asked twice; a failure of either still cleans up the run (and
    # mails the deployment: two callbacks).
    approval, promote = (dag["tasks"][task] for task in APPROVAL_TASKS)
    assert (approval["retries"], approval["failure_callbacks"]) == (0, 2)
    assert promote["failure_callbacks"] == 2
    assert "**A person approves each move of `champion`** (timeout 1h)" in dag["doc_md"]
    # Without `promotion:` a pipeline's DAG is as it was.
    assert parsed["dags"]["retrain_digits"]["task_order"] == TASK_IDS
    assert "A person approves" not in parsed["dags"]["retrain_digits"]["doc_md"]
    assert parsed["heavy_modules"] == []


def test_the_request_offers_approve_or_reject_and_rejects_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.providers.standard.operators.hitl import HITLOperator

    from stratoflow.config.run_plan import load_pipeline
    from stratoflow.dags.retrain import build_dag

    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(TEST_PIPELINES))
    for pipeline, timeout in (("digits_approval", 3600), ("digits_approval_timeout", 5)):
        approval = build_dag(load_pipeline(pipeline)).task_dict["approve_promotion"]
        assert isinstance(approval, HITLOperator)
        assert (approval.options, approval.defaults, approval.multiple) == (
            ["Approve", "Reject"],
            ["Reject"],
            False,
        )
        assert approval.response_timeout == timedelta(seconds=timeout)
        # Anyone with edit rights on the DAG's HITL details answers: no assigned users.
        assert approval.assigned_users is None


class _TaskInstance:
    """The one thing `PromotionApproval.execute` asks of Airflow's task instance before it
    writes the request (which needs a task runner): the earlier tasks' results."""

    def __init__(self, results: dict[str, Any]):
        self.results = results

    def xcom_pull(self, task_ids: str) -> Any:
        return self.results[task_ids]


def test_no_one_is_asked_when_the_gate_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from stratoflow.config.run_plan import load_pipeline, resolve_plan
    from stratoflow.dags.retrain import build_dag
    from stratoflow.tasks.evaluate import Evaluation
    from stratoflow.tasks.prepare import PreparedDataset
    from stratoflow.training.evaluation import GateDecision
    from tests.unit.stratoflow.tasks.test_run_context import DATASET

    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(TEST_PIPELINES))
    approval = build_dag(load_pipeline("digits_approval")).task_dict["approve_promotion"]
    plan = resolve_plan("digits_approval", {})
    failed = GateDecision(False, ["test_accuracy 0.2000 < 0.3"])
    results = {
        "prepare_dataset": PreparedDataset(DATASET, "r1", plan).to_dict(),
        "evaluate_model": Evaluation("r1", {"test_accuracy": 0.2}, failed).to_dict(),
        "log_and_register": {
            "registered_model": "stratoflow-digits-approval",
            "version": "3",
            "model_uri": "models:/m-1",
            "aliases": ["challenger"],
            "promoted": False,
            "mlflow_run_id": "r1",
        },
    }
    with pytest.raises(AirflowSkipException, match="the gate failed: champion stays where it is"):
        approval.execute({"ti": _TaskInstance(results)})
