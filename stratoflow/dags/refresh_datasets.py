"""Refresh a dataset and announce it: one DAG per TFDS dataset the pipelines read.

`refresh` prepares every version of the dataset the pipelines use (building what is missing,
fingerprinting what is there) and, on success, emits an event of the dataset's asset
(`x-tfds://<dataset>`), with the fingerprints as the event's extra. Every `retrain_<pipeline>`
DAG reading that dataset is scheduled on its cron *or* that asset, so a refresh retrains them.

No schedule: whatever produces new data triggers it (UI, REST API, another DAG). Posting an
asset event through the REST API (`POST /api/v2/assets/events`) triggers the retrains directly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, task

from stratoflow.config import names
from stratoflow.config.assets import (
    dataset_asset,
    pipelines_reading,
)
from stratoflow.dags import factory

OWNER = "ml-platform"
RETRIES = 1
RETRY_DELAY = timedelta(seconds=30)


def build_dag(dataset: str) -> DAG:
    """The DAG `refresh_<dataset>`: one task that prepares `dataset` and emits its asset event.

    Args:
        dataset: a TFDS dataset name that at least one pipeline spec reads.
    """
    asset = dataset_asset(dataset)
    readers = pipelines_reading(dataset)
    with factory.new_dag(
        names.refresh_dag_id(dataset),
        defaults={"owner": OWNER, "retries": RETRIES, "retry_delay": RETRY_DELAY},
        description=f"Refresh {dataset}; retrains {', '.join(readers)}.",
        doc_md=(__doc__ or "").strip()
        + f"\n\n## Dataset `{dataset}`\n\nRead by the pipelines: {', '.join(readers)}.",
        schedule=None,
        tags=["stratoflow", "dataset", dataset],
    ) as dag:

        @task(task_id=names.REFRESH_TASK, outlets=[asset], multiple_outputs=False)
        def refresh(**context: Any) -> dict[str, Any]:
            from stratoflow.tasks.refresh import refresh_dataset

            result = refresh_dataset(dataset).to_dict()
            context["outlet_events"][asset].extra = result  # travels with the asset event
            return result

        refresh()
    return dag
