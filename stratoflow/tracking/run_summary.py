"""The summary `stratoflow run` prints after a successful run, kept in the run's folder.

The task that ends the run (`log_and_register`, or `promote_champion` after an approval) has
MLflow loaded and writes what `reports.describe_dag_run` says of the run to the run folder; the
CLI reads that file instead of importing MLflow itself (about 2 s of CPU on every run). It holds
nothing secret (ids, metrics, the gate's reasons, the UI command); like all of the run folder,
it is its owner's only (the run's umask).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from stratoflow.config import locations

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def summary_path(dag_id: str, run_id: str) -> Path:
    """Where the summary of DAG run `run_id` of `dag_id` is kept."""
    return locations.run_dir(dag_id, run_id) / SUMMARY_FILE


def record(pipeline: str, dag_id: str, run_id: str) -> None:
    """Write what MLflow now says of the DAG run (`describe_dag_run`) to its run folder.

    A failure is logged, not raised: the run itself succeeded, and `stratoflow run` then asks
    MLflow itself.
    """
    from stratoflow.tracking.reports import describe_dag_run

    try:
        summary = describe_dag_run(pipeline, dag_id, run_id)
        path = summary_path(dag_id, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(summary))
        os.replace(temporary, path)  # a reader never sees half a file
    except Exception as error:
        log.warning(
            "Could not keep the summary of DAG run %s (%s: %s); stratoflow run reads it from "
            "MLflow",
            run_id,
            type(error).__name__,
            error,
        )


def recorded(dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The summary the run's last task kept, or None if there is none (or it is unreadable)."""
    try:
        summary = json.loads(summary_path(dag_id, run_id).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None
