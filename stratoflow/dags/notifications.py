"""Mail about a retrain run, through Airflow's SMTP notifier: failures, gate results, promotions.

Task callbacks of the retrain DAG (`stratoflow/dags/retrain.py` adds them beside the
clean-up callback):

- a task that failed for good (retries exhausted, or a refusal such as an invalid conf or a data
  gate): `<dag>: run <run> failed in <task>` (`refused in` for a refusal), the exception as the
  reason;
- `log_and_register` succeeded: `<dag>: run <run> promoted <model> version <n> to champion`, or
  `... evaluation gate failed, version <n> stays challenger` with the gate's reasons.

Recipients and SMTP connection are the deployment's (`stratoflow.config.notifications`); with no
recipients configured nothing is sent. The SMTP provider is imported only when a mail is sent, so
parsing the DAG files stays light. A mail that cannot be sent is logged by Airflow's callback
runner and changes nothing about the run (each callback of a task runs on its own).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from stratoflow.config import names, notifications

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "[stratoflow]"


def on_task_failure(context: Any) -> None:
    """A retrain task's failure callback: mail why it failed."""
    ti = context["ti"]
    error = context.get("exception")
    verb = "refused" if isinstance(error, AirflowFailException) else "failed"
    send(
        context,
        f"run {context['run_id']} {verb} in {ti.task_id}",
        [("task", f"{ti.task_id}, try {ti.try_number}"), ("reason", str(error or "unknown"))],
    )


def on_registered(context: Any) -> None:
    """`log_and_register`'s success callback: mail a promotion, or a gate that failed."""
    ti = context["ti"]
    registered = ti.xcom_pull(task_ids=names.REGISTER_TASK) or {}
    evaluated = ti.xcom_pull(task_ids=names.EVALUATE_TASK) or {}
    gate = evaluated.get("gate") or {}
    model, version = registered.get("registered_model"), registered.get("version")
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in (evaluated.get("test_metrics") or {}).items())
    details = [("model", f"{model} version {version}"), ("test metrics", metrics or "-")]
    if registered.get("promoted"):
        what = f"promoted {model} version {version} to champion"
    elif not gate.get("passed", True):
        what = f"evaluation gate failed, {model} version {version} stays challenger"
        details.append(("reason", "; ".join(gate.get("reasons") or ["not given"])))
    else:
        return  # passed but not promoted (`promote: false`): asked for, nothing to tell
    send(context, f"run {context['run_id']} {what}", details)


def send(context: Any, what: str, details: list[tuple[str, str]]) -> None:
    """Mail `<prefix> <dag>: <what>` with `details` to the deployment's recipients, if any."""
    recipients = notifications.email_recipients()
    if not recipients:
        return
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    dag_id = context["dag"].dag_id
    rows = [("DAG", dag_id), ("run", context["run_id"]), *details]
    body = "".join(
        f"<p><b>{html.escape(label)}</b>: {html.escape(str(value))}</p>" for label, value in rows
    )
    notifier = SmtpNotifier(
        to=recipients,
        subject=f"{SUBJECT_PREFIX} {dag_id}: {what}",
        html_content=f"<html><body>{body}</body></html>",
        smtp_conn_id=notifications.smtp_conn_id(),
    )
    # `notify`, not the notifier's `__call__`: that would render the texts as Jinja templates,
    # and an exception's message is not one.
    notifier.notify(context)
    log.info("mailed %s about %s: %s", ", ".join(recipients), dag_id, what)


def with_failure_mail(callback: Callable[[Any], None]) -> list[Callable[[Any], None]]:
    """A task's failure callbacks: `callback` first (it cleans up), then the mail."""
    return [callback, on_task_failure]
