"""The approval steps of a retrain DAG whose pipeline asks for them; this file defines no DAG.

`promotion: {approval: required, timeout: 3d}` in `pipeline.yaml` adds two tasks after
`log_and_register` (which then registers the version with `challenger` only):

- `approve_promotion`: an Airflow human-in-the-loop request (Airflow 3.3's `HITLOperator`). The
  task waits in the state "awaiting input" (no worker slot, no triggerer) and shows its report
  (`stratoflow.tasks.approve.approval_request`: the gate, the test metrics against the champion's)
  under the run's "Required Actions" in the Airflow UI, with the buttons Approve and Reject. It is
  skipped, asking no one, when the gate failed or the run's `promote` setting is off.
- `promote_champion`: moves `champion` on "Approve"; on "Reject", or when the timeout passed (the
  scheduler then answers the request's default, "Reject"), leaves it where it was. Either way the
  version and the MLflow run carry the outcome (`stratoflow.tasks.approve.decide`).

Who may answer: an Airflow user allowed to edit the DAG's "HITL Detail" (FAB's roles User, Op
and Admin); a Viewer sees the request but cannot answer it (the API answers 403).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowSkipException

from stratoflow.config import names
from stratoflow.config.promotion import APPROVE, REJECT
from stratoflow.config.spec import PipelineSpec
from stratoflow.dags import factory

# Shown until the task has written its report (the request is made when the task runs).
PENDING_SUBJECT = "Promote the new version to champion?"


class PromotionApproval(HITLOperator):
    """A human-in-the-loop request whose report is written when it runs, from the run's results.

    Approve or Reject; Reject is the answer when the timeout passes, so a timeout ends the task
    successfully and `promote_champion` records it, instead of failing the run (whose failure
    callback would remove the registered version).
    """

    def __init__(self, *, response_timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(
            subject=PENDING_SUBJECT,
            options=[APPROVE, REJECT],
            defaults=[REJECT],
            multiple=False,
            response_timeout=response_timeout,
            **kwargs,
        )

    def execute(self, context: Any) -> Any:
        from stratoflow.tasks import approve
        from stratoflow.tasks.evaluate import Evaluation
        from stratoflow.tasks.prepare import PreparedDataset
        from stratoflow.tasks.register import Registration

        ti = context["ti"]
        request = approve.approval_request(
            PreparedDataset.from_dict(ti.xcom_pull(task_ids=names.PREPARE_TASK)).plan.spec,
            Evaluation.from_dict(ti.xcom_pull(task_ids=names.EVALUATE_TASK)),
            Registration.from_dict(ti.xcom_pull(task_ids=names.REGISTER_TASK)),
        )
        if not request.needed or request.report is None:
            raise AirflowSkipException(request.reason)
        self.subject = request.report.subject
        self.body = request.report.to_markdown()
        self.log.info("%s\n%s", self.subject, self.body)
        return super().execute(context)


def add_approval_steps(dag: DAG, spec: PipelineSpec, registered: Any) -> None:
    """Add `approve_promotion` → `promote_champion` after `log_and_register` (inside the DAG),
    and say so in the DAG's documentation.

    Args:
        dag: the retrain DAG.
        spec: the pipeline's spec (its `promotion` section).
        registered: the XComArg of `log_and_register`.
    """
    dag.doc_md = (
        f"{dag.doc_md or ''}\n\n**A person approves each move of `champion`** (timeout "
        f"{spec.promotion.timeout}): `approve_promotion` waits for Approve or Reject under the "
        "run's Required Action; a rejection or the timeout leaves `champion` where it was."
    )
    approval = PromotionApproval(
        task_id=names.APPROVE_TASK,
        response_timeout=timedelta(seconds=spec.promotion.timeout_seconds),
        # A person's answer is not retried: a retry would ask again.
        retries=0,
    )

    @factory.refusing_task(task_id=names.PROMOTE_TASK, multiple_outputs=False)
    def promote_champion(
        registration: dict[str, Any], response: dict[str, Any], **context: Any
    ) -> dict[str, Any]:
        from stratoflow.tasks import approve
        from stratoflow.tasks.register import Registration
        from stratoflow.tracking import run_summary

        run = factory.airflow_run(context)
        decision = approve.decide(run, Registration.from_dict(registration), response).to_dict()
        run_summary.record(spec.name, run.dag_id, run.run_id)  # champion may have moved
        return decision

    registered >> approval
    promote_champion(registered, approval.output)
