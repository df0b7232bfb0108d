"""The retrain DAG's data gate task: the run's data against the champion's, before any training.

It reads the statistics the first task computed (the run folder's `statistics.json`), logs them to
the run's MLflow run (`data/statistics.json` and `.html`: the version this run registers keeps
them through its run), fetches the champion's from the champion version's run, and checks the
data as the pipeline's `validation:` declares (`stratoflow.training.data_gate`). A failing check
raises `DataGateError`, a refusal: the task fails without a retry, `train_model` never starts and
nothing is registered; the report (`data/gate.json` and `.html`) is in MLflow, each anomaly on a
line of the task log and in the exception's message (the CLI's last lines).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from stratoflow.config import locations, names
from stratoflow.data.statistics import STATISTICS_FILE, DatasetStatistics
from stratoflow.tasks.prepare import PreparedDataset
from stratoflow.tasks.run_context import AirflowRun, XComResult, freezes_heap

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataGateResult(XComResult):
    """What the data gate decided (the XCom of `validate_data`).

    Attributes:
        passed: the run may train.
        accepted_drift: it trains because `accept_drift` accepted the anomalies.
        champion: the champion version compared with ("" without one).
        anomalies: what the gate found, one line each.
    """

    passed: bool
    accepted_drift: bool
    champion: str = ""
    anomalies: list[str] = field(default_factory=list)

    PRODUCER = names.VALIDATE_DATA_TASK


@freezes_heap
def validate_data(run: AirflowRun, prepared: PreparedDataset) -> DataGateResult:
    """Log the run's statistics and check its data against the champion's.

    Raises:
        DataGateError: the data gate failed (a refusal; the message lists the anomalies).
        FileNotFoundError: the run folder has no statistics (the first task did not finish).
    """
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training import data_gate

    plan = prepared.plan
    spec = plan.spec
    run_id = prepared.mlflow_run_id
    statistics = DatasetStatistics.from_dict(
        json.loads((locations.run_dir(run.dag_id, run.run_id) / STATISTICS_FILE).read_text())
    )
    mlflow_client = mlflow_runs.client()
    mlflow_client.log_dict(run_id, statistics.to_dict(), names.STATISTICS_ARTIFACT)
    mlflow_client.log_text(
        run_id, data_gate.statistics_html(statistics), names.STATISTICS_HTML_ARTIFACT
    )
    mlflow_runs.log_metrics(run_id, {names.STATISTICS_SECONDS_METRIC: statistics.seconds})

    version, champion = champion_statistics(spec.registered_model)
    report = data_gate.check_data(
        statistics,
        champion,
        spec.validation,
        accept_drift=plan.training.accept_drift,
        champion_version=version,
    )
    for note in report.notes:
        logger.info("data gate: %s", note)
    for anomaly in report.anomalies:
        logger.log(
            logging.WARNING if report.passed else logging.ERROR,
            "data gate anomaly: %s",
            anomaly.describe(),
        )
    mlflow_client.log_dict(run_id, report.to_dict(), names.DATA_GATE_ARTIFACT)
    mlflow_client.log_text(
        run_id, data_gate.report_html(report, spec.name), names.DATA_GATE_HTML_ARTIFACT
    )
    mlflow_runs.set_tags(
        run_id,
        {
            names.DATA_GATE_PASSED_TAG: report.passed,
            names.DATA_GATE_ACCEPTED_TAG: report.accepted_drift,
            names.DATA_GATE_ANOMALIES_TAG: len(report.anomalies),
            names.DATA_GATE_CHAMPION_TAG: report.champion or "none",
        },
    )
    logger.info("%s", report.summary())
    if not report.passed:
        raise data_gate.DataGateError(report.summary())
    return DataGateResult(
        passed=report.passed,
        accepted_drift=report.accepted_drift,
        champion=report.champion or "",
        anomalies=[anomaly.describe() for anomaly in report.anomalies],
    )


def champion_statistics(model_name: str) -> tuple[str | None, DatasetStatistics | None]:
    """The champion version and the statistics of the data it was trained on (its run's
    `data/statistics.json`); `(None, None)` without a champion, `(version, None)` for a champion
    whose run has none (trained before statistics were kept)."""
    from stratoflow.tracking import mlflow_runs

    # An MLflow that does not answer fails the task (and Airflow retries it): it must not pass
    # for "no champion", which would let the data through unchecked.
    mlflow_runs.check_reachable()
    mlflow_client = mlflow_runs.client()
    try:
        version = mlflow_client.get_model_version_by_alias(model_name, names.CHAMPION)
    except Exception:  # no such registered model, or no champion alias
        return None, None
    folder_of_artifact = str(Path(names.STATISTICS_ARTIFACT).parent)
    listed = {
        item.path for item in mlflow_client.list_artifacts(version.run_id, folder_of_artifact)
    }
    if names.STATISTICS_ARTIFACT not in listed:
        logger.warning(
            "champion version %s (run %s) has no %s: trained before statistics were kept; the "
            "data gate checks missing values and declared ranges only",
            version.version,
            version.run_id,
            names.STATISTICS_ARTIFACT,
        )
        return str(version.version), None
    data = mlflow_runs.load_json_artifact(version.run_id, names.STATISTICS_ARTIFACT)
    return str(version.version), DatasetStatistics.from_dict(data)
