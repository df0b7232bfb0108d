"""A person between the gate and `champion`: what the approver reads, and what their answer does.

With `promotion.approval: required` (`stratoflow.config.promotion`), `log_and_register`
registers the version with `challenger` only; the retrain DAG then asks a person in the Airflow
UI (`approve_promotion`, a human-in-the-loop task, `stratoflow/dags/approval.py`), showing the
report `approval_request` writes; `promote_champion` (`decide`) moves `champion` only on "Approve".
A "Reject", or no answer before the timeout (the request's default answer is "Reject"), leaves
`champion` where it was, and the version and the MLflow run say so in their tags.

The report is a typed object (`ApprovalReport`, `to_dict()`), made of sections; a new check adds
its own section builder to `SECTION_BUILDERS`, and the approver sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stratoflow.config import names
from stratoflow.config.promotion import APPROVE
from stratoflow.config.spec import PipelineSpec
from stratoflow.tasks.evaluate import Evaluation
from stratoflow.tasks.register import Registration
from stratoflow.tasks.run_context import AirflowRun, XComResult

logger = logging.getLogger(__name__)

# The outcomes, as the tags on the version and the MLflow run spell them.
APPROVED = "approved"
REJECTED = "rejected"
TIMED_OUT = "timed out"
# Tags on the model version and the MLflow run.
DECISION_TAG = "stratoflow.approval"
RESPONDER_TAG = "stratoflow.approval.by"
NOTE_TAG = "stratoflow.approval.note"
REPORT_ARTIFACT = "approval/report.json"


@dataclass(frozen=True)
class ReportSection:
    """One part of the approval report: a title, a table and notes.

    Attributes:
        title: the section's heading.
        columns: the table's column names (no table when empty).
        rows: the table's rows, one value per column.
        notes: sentences shown under the table (e.g. the gate's reasons).
    """

    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_markdown(self) -> str:
        lines = [f"### {self.title}"]
        if self.columns:
            lines += [
                "",
                "| " + " | ".join(self.columns) + " |",
                "|" + "---|" * len(self.columns),
                *("| " + " | ".join(_cell(value) for value in row) + " |" for row in self.rows),
            ]
        if self.notes:
            lines += ["", *(f"- {note}" for note in self.notes)]
        return "\n".join(lines)


@dataclass(frozen=True)
class ApprovalReport:
    """What the approver reads before answering (the body of the Airflow request).

    Attributes:
        pipeline: the pipeline.
        registered_model: the registered model.
        version: the challenger's version (holds `challenger`).
        mlflow_run_id: the DAG run's MLflow run.
        champion_version: the version holding `champion` now, or None.
        sections: the report's parts, in order (`SECTION_BUILDERS`).
    """

    pipeline: str
    registered_model: str
    version: str
    mlflow_run_id: str
    champion_version: str | None
    sections: list[ReportSection]

    @property
    def subject(self) -> str:
        """The request's headline."""
        return f"Promote {self.registered_model} version {self.version} to champion?"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_markdown(self) -> str:
        champion = f"version {self.champion_version}" if self.champion_version else "no version yet"
        head = (
            f"Pipeline `{self.pipeline}`: version **{self.version}** of `{self.registered_model}` "
            f"passed the gate (MLflow run `{self.mlflow_run_id}`). `champion` is {champion}.\n\n"
            f"**Approve** moves `champion` to version {self.version}; **Reject**, or no answer "
            "before the timeout, leaves it where it is."
        )
        return "\n\n".join([head, *(section.to_markdown() for section in self.sections)])


@dataclass(frozen=True)
class ReportInputs:
    """What a section builder may read: the run's spec and results, the champion's metrics."""

    spec: PipelineSpec
    evaluation: Evaluation
    registration: Registration
    champion_metrics: dict[str, float]


def metrics_section(inputs: ReportInputs) -> ReportSection:
    """The challenger's test metrics beside the champion's, and the difference."""
    rows = []
    for metric, value in sorted(inputs.evaluation.test_metrics.items()):
        champion = inputs.champion_metrics.get(metric)
        change = None if champion is None else value - champion
        rows.append([metric, value, champion, change])
    return ReportSection(
        "Test metrics against the champion",
        columns=["metric", "challenger", "champion", "change"],
        rows=rows,
    )


def gate_section(inputs: ReportInputs) -> ReportSection:
    """The gate's rule and its reasons."""
    gate = inputs.spec.evaluation
    better = ">=" if gate.higher_is_better else "<="
    rule = (
        f"{gate.metric} {better} {gate.bound}, at most {gate.max_regression} worse than the "
        "champion"
    )
    passed = "passed" if inputs.evaluation.gate.passed else "failed"
    return ReportSection(
        f"Gate: {passed}", notes=[f"rule: {rule}", *inputs.evaluation.gate.reasons]
    )


def checks_section(inputs: ReportInputs) -> ReportSection:
    """Every check of the gate, slices included: value, bound, champion's value, verdict."""
    rows = [
        [
            check.name,
            check.metric,
            check.value,
            check.champion_value,
            check.bound,
            check.max_regression,
            "passed" if check.passed else "FAILED",
        ]
        + ([] if check.gated else ["(reported only)"])
        for check in inputs.evaluation.gate.checks
    ]
    return ReportSection(
        "Checks: metrics and slices against the champion",
        columns=["check", "metric", "challenger", "champion", "bound", "max regression", "verdict"],
        rows=[row[:7] for row in rows],
        notes=[
            f"{row[0]}: too few examples to gate, reported only" for row in rows if len(row) > 7
        ],
    )


def serving_section(inputs: ReportInputs) -> ReportSection:
    """The serving check's verdict: the version loaded in a fresh process, as it will serve."""
    verdict = inputs.registration.serving_check or "not run"
    return ReportSection("Served in a fresh process", notes=[verdict])


def drift_section(inputs: ReportInputs) -> ReportSection:
    """The data gate's findings: this run's training data against the champion's."""
    from stratoflow.tracking import mlflow_runs

    try:
        report = mlflow_runs.load_json_artifact(
            inputs.registration.mlflow_run_id, names.DATA_GATE_ARTIFACT
        )
    except Exception as error:  # noqa: BLE001 - a report without it still helps the approver
        return ReportSection("Data against the champion's", notes=[f"no data gate report: {error}"])
    rows = [
        [row["feature"], row["distance"], row["value"], row["bound"], row["drifted"]]
        for row in report.get("drift", [])
    ]
    notes = [*report.get("notes", [])]
    if report.get("accepted_drift"):
        notes.append("anomalies were accepted for this run (accept_drift)")
    notes += [_anomaly_line(anomaly) for anomaly in report.get("anomalies", [])]
    return ReportSection(
        "Data against the champion's (drift)",
        columns=["feature", "distance", "value", "bound", "drifted"] if rows else [],
        rows=rows,
        notes=notes,
    )


def _anomaly_line(anomaly: Mapping[str, Any]) -> str:
    return f"anomaly: {anomaly.get('check')}: {anomaly.get('message')}"


# Each builder adds one section to the report, in this order.
SECTION_BUILDERS: list[Callable[[ReportInputs], ReportSection]] = [
    gate_section,
    checks_section,
    metrics_section,
    serving_section,
    drift_section,
]


@dataclass(frozen=True)
class ApprovalRequest:
    """What `approve_promotion` asks, or why it asks nothing (`needed` false: it is skipped)."""

    needed: bool
    reason: str
    report: ApprovalReport | None = None


def approval_request(
    spec: PipelineSpec, evaluation: Evaluation, registration: Registration
) -> ApprovalRequest:
    """The request for a person, with its report logged to the MLflow run; or why none is needed.

    No person is asked when the gate failed or the run's `promote` setting is off: `champion`
    does not move either way.

    Args:
        spec: the run's spec (its plan's: the run's Params applied).
        evaluation: the `evaluate_model` result (metrics, the gate's decision).
        registration: the `log_and_register` result (the version holds `challenger`).
    """
    if not evaluation.gate.passed:
        return ApprovalRequest(False, "the gate failed: champion stays where it is")
    if not spec.training.promote:
        return ApprovalRequest(False, "the run's promote setting is off: nothing to approve")
    if not registration.serving_check.startswith("passed"):
        why = registration.serving_check or "it did not run"
        return ApprovalRequest(False, f"the serving check failed ({why}): champion stays")
    from stratoflow.tracking import mlflow_runs

    champion_version, champion_metrics = _champion(registration.registered_model)
    inputs = ReportInputs(spec, evaluation, registration, champion_metrics)
    report = ApprovalReport(
        pipeline=spec.name,
        registered_model=registration.registered_model,
        version=registration.version,
        mlflow_run_id=registration.mlflow_run_id,
        champion_version=champion_version,
        sections=[build(inputs) for build in SECTION_BUILDERS],
    )
    mlflow_runs.client().log_dict(registration.mlflow_run_id, report.to_dict(), REPORT_ARTIFACT)
    return ApprovalRequest(True, "the gate passed", report)


def _champion(model_name: str) -> tuple[str | None, dict[str, float]]:
    """The version holding `champion` and its run's test metrics; (None, {}) without one."""
    from stratoflow.tracking import mlflow_runs

    found = mlflow_runs.champion_metrics(model_name)
    if found is None:
        return None, {}
    version, metrics = found
    return version, {key: value for key, value in metrics.items() if key.startswith("test_")}


@dataclass
class PromotionDecision(XComResult):
    """What the approver's answer did (the XCom of `promote_champion`).

    Attributes:
        outcome: `approved`, `rejected` or `timed out`.
        responded_by: the Airflow user who answered; empty when the timeout answered.
        registered_model: the registered model.
        version: the challenger's version.
        champion: the version holding `champion` afterwards (empty if none does).
        promoted: True when `champion` moved to `version`.
    """

    outcome: str
    responded_by: str
    registered_model: str
    version: str
    champion: str
    promoted: bool

    PRODUCER = names.PROMOTE_TASK


def decide(
    run: AirflowRun, registration: Registration, response: Mapping[str, Any]
) -> PromotionDecision:
    """Move `champion` to the registered version if the approver chose "Approve"; record why not.

    Args:
        run: the DAG run.
        registration: the `log_and_register` result (the version holds `challenger`).
        response: the `approve_promotion` result: Airflow's human-in-the-loop answer
            (`chosen_options`, `responded_by_user`: None when the timeout chose the default).

    Returns:
        The outcome, tagged on the version and the MLflow run as well.
    """
    from stratoflow.tracking import mlflow_runs, model_registry

    chosen = list(response.get("chosen_options") or [])
    responder = response.get("responded_by_user") or {}
    responded_by = str(responder.get("name") or responder.get("id") or "")
    model, version = registration.registered_model, registration.version
    mlflow_client = mlflow_runs.client()
    previous = model_registry.alias_targets(mlflow_client, model).get(names.CHAMPION, "")
    if chosen == [APPROVE] and responded_by:
        outcome = APPROVED
        note = f"approved by {responded_by}: champion moved from {previous or 'none'} to {version}"
    elif responded_by:
        outcome = REJECTED
        note = f"rejected by {responded_by}: champion stays {previous or 'unset'}"
    else:
        outcome = TIMED_OUT
        note = f"no answer before the timeout: champion stays {previous or 'unset'}"
    tags = {DECISION_TAG: outcome, RESPONDER_TAG: responded_by, NOTE_TAG: note}
    # The tags first, the alias last: a failure in between leaves champion where it was.
    for key, value in tags.items():
        mlflow_client.set_model_version_tag(model, version, key, value)
        mlflow_client.set_tag(registration.mlflow_run_id, key, value)
    if outcome == APPROVED:
        model_registry.move_alias(model, version, names.CHAMPION)
    logger.info("%s (%s %s, DAG run %s)", note, model, version, run.run_id)
    return PromotionDecision(
        outcome=outcome,
        responded_by=responded_by,
        registered_model=model,
        version=version,
        champion=version if outcome == APPROVED else previous,
        promoted=outcome == APPROVED,
    )


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).replace("|", "\\|")
